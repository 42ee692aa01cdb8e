from .app import main

if __name__ == "__main__":  # not when a spawned process imports it as its parent's main
    main()
