/* The tasks page's live refresh: after each "readiness" event (groups became ready, so their
 * tasks' statistics changed) the counts are read again from ?format=json, at most every 2 s.
 * Writes text and bar heights only. */
(function () {
  "use strict";
  // Bar heights are set here, not in style attributes (the pages' CSP refuses inline styles).
  Array.prototype.forEach.call(document.querySelectorAll(".histogram .bar[data-pct]"), function (bar) {
    bar.style.height = bar.getAttribute("data-pct") + "%";
  });
  var box = document.getElementById("task-buckets");
  if (!box || !window.ClawLive) return;
  var pending = null;

  function refresh() {
    pending = null;
    fetch(box.getAttribute("data-url"), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        Object.keys(data.buckets).forEach(function (k) {
          var el = box.querySelector('[data-bucket="' + k + '"]');
          if (el) el.textContent = String(data.buckets[k]);
        });
        data.bins.forEach(function (b, i) {
          var count = document.querySelector('[data-bin-count="' + i + '"]');
          if (count) count.textContent = String(b.count);
          var bar = document.querySelector('[data-bin="' + i + '"] .bar');
          if (bar) bar.style.height = b.pct + "%";
        });
      })
      .catch(function () {});
  }

  window.ClawLive.on("readiness", function () {
    if (!pending) pending = setTimeout(refresh, 2000);
  });
})();
