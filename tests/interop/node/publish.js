// A publisher written for the delayed-message-exchange plugin, as amqplib users write it:
// publish to the exchange with an `x-delay` header (ms). One thing changed for the x-delay
// bridge: the exchange is declared with its plain type (the plugin's `x-delayed-message`
// type does not exist on RabbitMQ 4.3); its `x-delayed-type` argument may stay.
//
//   node publish.js SPEC.json      (or the JSON on stdin)
//
// SPEC: {"url", "exchange", "type", "messages": [{"routingKey", "body", "delay",
//         "headers", "options"}]}; `delay` null sends no x-delay header.
// Prints one JSON line per message once every message is confirmed:
//   {"index", "sentAt"}   (Date.now() just before the publish, in ms)
'use strict';

const amqp = require('amqplib');
const fs = require('fs');

async function main() {
  const source = process.argv[2] ? fs.readFileSync(process.argv[2], 'utf8') : fs.readFileSync(0, 'utf8');
  const spec = JSON.parse(source);
  const connection = await amqp.connect(spec.url);
  try {
    const channel = await connection.createConfirmChannel();
    // was: assertExchange(name, 'x-delayed-message', {arguments: {'x-delayed-type': type}})
    await channel.assertExchange(spec.exchange, spec.type, {
      durable: true,
      arguments: { 'x-delayed-type': spec.type },
    });
    const sent = [];
    spec.messages.forEach((message, index) => {
      const headers = Object.assign({}, message.headers || {});
      if (message.delay !== null && message.delay !== undefined) {
        headers['x-delay'] = message.delay;
      }
      const options = Object.assign({}, message.options || {}, { headers });
      if (options.timestamp !== undefined) options.timestamp = Number(options.timestamp);
      sent.push({ index, sentAt: Date.now() });
      channel.publish(spec.exchange, message.routingKey || '', Buffer.from(message.body), options);
    });
    await channel.waitForConfirms();
    for (const line of sent) process.stdout.write(JSON.stringify(line) + '\n');
    await channel.close();
  } finally {
    await connection.close();
  }
}

main().catch((error) => {
  process.stderr.write(`publish.js: ${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
