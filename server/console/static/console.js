// The live chart of a stream's page: the change feed (EventSource, snapshot first) applied
// to the view's rows, plotted with uPlot as the sum of the chosen value column over the
// groups of each window; late revisions are red points and a list. What the canvas shows
// is mirrored in #chart's data attributes (data-position, data-windows, data-latest-window,
// data-latest-value, data-late-revisions, data-caught-up) for tests and scripts.
(function () {
  "use strict";
  const root = document.getElementById("chart");
  if (!root) return;
  const stream = root.dataset.stream;
  const windowColumn = root.dataset.window;
  const keys = JSON.parse(root.dataset.keys);
  const select = document.getElementById("value");
  const list = document.getElementById("revisions");
  const rows = new Map(); // JSON of a row's key -> the row
  const lateAt = new Map(); // window (seconds) -> late revisions in it
  let plot = null;
  let pending = false;

  function seconds(value) {
    return Date.parse(value) / 1000;
  }

  function sums(column) {
    const totals = new Map();
    for (const row of rows.values()) {
      const x = seconds(row[windowColumn]);
      totals.set(x, (totals.get(x) || 0) + Number(row[column] || 0));
    }
    return totals;
  }

  function draw() {
    pending = false;
    const column = select.value;
    const totals = sums(column);
    const xs = [...totals.keys()].sort((a, b) => a - b);
    const ys = xs.map((x) => totals.get(x));
    const late = xs.map((x) => (lateAt.has(x) ? totals.get(x) : null));
    const data = [xs, ys, late];
    if (plot === null) {
      plot = new uPlot(
        {
          width: Math.min(1000, window.innerWidth - 60),
          height: 320,
          series: [
            {},
            { label: column, stroke: "#1f5fa8", width: 2 },
            {
              label: "late revision",
              stroke: "#c62828",
              fill: "#c62828",
              paths: () => null,
              points: { show: true, size: 11, fill: "#c62828" },
            },
          ],
        },
        data,
        root,
      );
    } else {
      plot.setData(data);
    }
    root.dataset.windows = String(xs.length);
    if (xs.length) {
      const last = xs[xs.length - 1];
      root.dataset.latestWindow = new Date(last * 1000).toISOString();
      root.dataset.latestValue = String(totals.get(last));
    }
  }

  function schedule() {
    if (!pending) {
      pending = true;
      requestAnimationFrame(draw);
    }
  }

  function describeKey(key) {
    return keys.map((k) => `${k} ${key[k]}`).join(", ");
  }

  function revised(change) {
    const column = select.value;
    const before = change.old ? Number(change.old[column] || 0) : 0;
    const after = change.new ? Number(change.new[column] || 0) : 0;
    const x = seconds(change.key[windowColumn]);
    lateAt.set(x, (lateAt.get(x) || 0) + 1);
    const item = document.createElement("li");
    item.className = "revision";
    item.dataset.window = change.key[windowColumn];
    item.dataset.delta = String(after - before);
    item.dataset.lateness = String(change.lateness_seconds);
    item.dataset.position = String(change.position);
    const minutes = Math.round(change.lateness_seconds / 60);
    const sign = after - before >= 0 ? "+" : "";
    item.textContent =
      `${describeKey(change.key)}: ${column} ${before} → ${after} (${sign}${after - before}), ` +
      `${minutes} min late, ${change.cause}` + (change.runs ? ` (${change.runs.join(", ")})` : "");
    list.prepend(item);
    root.dataset.lateRevisions = String(Number(root.dataset.lateRevisions) + 1);
  }

  function apply(change) {
    const key = JSON.stringify(change.key);
    if (change.op === "delete") rows.delete(key);
    else rows.set(key, change.new);
    if (change.late) revised(change);
    root.dataset.position = String(change.position);
    schedule();
  }

  const url = `/streams/${encodeURIComponent(stream)}/changes?snapshot=true`;
  const source = new EventSource(url);
  source.onmessage = (event) => apply(JSON.parse(event.data));
  source.addEventListener("progress", (event) => {
    root.dataset.position = String(JSON.parse(event.data).position);
    root.dataset.caughtUp = "true";
    schedule();
  });
  source.onerror = () => {
    root.dataset.caughtUp = "false"; // EventSource reconnects with Last-Event-ID itself
  };
  select.addEventListener("change", schedule);
})();
