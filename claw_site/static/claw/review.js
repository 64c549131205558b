// The review workbench (templates/curation/review.html): hotkeys, stars, the slider and the
// group ranking. Keyboard-only review: a digit sets the rating (group mode: ranks the
// rollout with that number, best first, or picks it as the best), Enter submits and the
// next item loads; j / k next / previous item, s skip, c comment, ? help. Keys are ignored
// while a text box has the focus (Esc leaves it). The form works without this script: the
// stars are radio buttons, the ranks selects. No dependencies.
(function () {
  "use strict";
  var bench = document.getElementById("workbench");
  if (!bench) return;
  var form = document.getElementById("review-form");
  var help = document.getElementById("hotkeys-help");
  var toggle = document.getElementById("help-toggle");
  var mode = bench.dataset.mode;
  var widget = bench.dataset.widget;
  var lo = Number(bench.dataset.ratingMin), hi = Number(bench.dataset.ratingMax);

  function setHelp(open) {
    if (!help) return;
    help.hidden = !open;
    if (toggle) toggle.setAttribute("aria-expanded", open ? "true" : "false");
  }
  if (toggle) toggle.addEventListener("click", function () { setHelp(help.hidden); });
  if (help) help.addEventListener("click", function (ev) { if (ev.target === help) setHelp(false); });

  function typing(el) {
    if (!el || !el.tagName) return false;
    var tag = el.tagName.toLowerCase();
    if (tag === "textarea" || tag === "select") return true;
    if (tag !== "input") return el.isContentEditable;
    return ["text", "number", "search", "email", "url", "password", ""].indexOf(el.type || "") >= 0;
  }

  function press(id) {
    var b = document.getElementById(id);
    if (b && !b.disabled && form) form.requestSubmit(b);
  }

  // --- stars and slider ---------------------------------------------------------------------
  var stars = form ? form.querySelectorAll("#rating-stars input[name=rating]") : [];
  var out = document.getElementById("rating-value");
  function paintStars() {
    var chosen = null;
    stars.forEach(function (s) { if (s.checked) chosen = Number(s.value); });
    form.querySelectorAll("#rating-stars label[data-star]").forEach(function (l) {
      l.classList.toggle("on", chosen !== null && Number(l.dataset.star) <= chosen);
    });
    if (out) out.textContent = chosen === null ? "not rated" : chosen + " / " + hi;
  }
  if (stars.length) {
    stars.forEach(function (s) { s.addEventListener("change", paintStars); });
    paintStars();
  }
  var slider = document.getElementById("rating-slider");
  var number = form ? form.querySelector("input[type=number][name=rating]") : null;
  if (slider && number) {
    slider.addEventListener("input", function () { number.value = slider.value; });
    number.addEventListener("input", function () { if (number.value !== "") slider.value = number.value; });
  }
  function rate(digit) {
    if (stars.length) {
      stars.forEach(function (s) {
        if (Number(s.value) === digit) { s.checked = true; s.focus(); }
      });
      paintStars();
    } else if (number) {
      // The slider's range in five steps: 1 = lowest, 5 = highest.
      if (digit < 1 || digit > 5) return;
      var v = lo + (hi - lo) * (digit - 1) / 4;
      v = Math.round(v * 100) / 100;
      number.value = String(v);
      if (slider) slider.value = String(v);
    }
  }

  // --- group mode: rank by pressing the rollouts' numbers, best first ----------------------
  var order = [];
  var cards = Array.prototype.slice.call(document.querySelectorAll(".rollout[data-rollout]"));
  var bestMode = !!document.querySelector("input[name=best]");
  function paintRanks() {
    var n = cards.length;
    cards.forEach(function (card) {
      var sel = card.querySelector("select");
      var badge = card.querySelector("[data-rank-badge]");
      var rank = sel && sel.value ? Number(sel.value) : null;
      var best = card.querySelector("input[name=best]");
      if (best) rank = best.checked ? 1 : null;
      card.classList.toggle("ranked", rank !== null);
      card.classList.toggle("best", rank === 1);
      if (badge) badge.textContent = rank === null ? "" : (bestMode ? "best" : "rank " + rank + " of " + n);
    });
    var now = document.getElementById("ranking-now");
    if (now) {
      var ranked = cards.filter(function (c) { return c.classList.contains("ranked"); }).length;
      now.textContent = bestMode ? (ranked ? "Best picked: Enter submits." : "")
        : (ranked === n ? "All " + n + " ranked: Enter submits." : (ranked ? ranked + " of " + n + " ranked" : ""));
    }
  }
  function rank(digit) {
    var card = cards[digit - 1];
    if (!card) return;
    if (bestMode) {
      card.querySelector("input[name=best]").checked = true;
    } else {
      var sel = card.querySelector("select");
      if (!sel || sel.value) return; // ranked already: 0 starts over
      order.push(digit);
      sel.value = String(order.length);
    }
    paintRanks();
  }
  function rankReset() {
    order = [];
    cards.forEach(function (card) {
      var sel = card.querySelector("select");
      if (sel) sel.value = "";
      var best = card.querySelector("input[name=best]");
      if (best) best.checked = false;
    });
    paintRanks();
  }
  if (cards.length) {
    // Ranks chosen with the selects count as pressed, in rank order.
    cards.forEach(function (card) {
      card.addEventListener("change", function () {
        order = cards.map(function (c, i) {
          var s = c.querySelector("select");
          return s && s.value ? { d: i + 1, r: Number(s.value) } : null;
        }).filter(Boolean).sort(function (a, b) { return a.r - b.r; }).map(function (x) { return x.d; });
        paintRanks();
      });
    });
    paintRanks();
  }

  // --- keys -----------------------------------------------------------------------------------
  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.key === "Escape") {
      if (help && !help.hidden) { setHelp(false); ev.preventDefault(); return; }
      if (typing(document.activeElement)) { document.activeElement.blur(); ev.preventDefault(); }
      return;
    }
    if (typing(ev.target)) return;
    if (ev.key === "?") { setHelp(help.hidden); ev.preventDefault(); return; }
    if (!form) return;
    if (/^[0-9]$/.test(ev.key)) {
      var d = Number(ev.key);
      if (mode === "group") { if (d === 0) rankReset(); else rank(d); } else rate(d);
      ev.preventDefault();
    } else if (ev.key === "Enter") {
      if (ev.target.tagName && ev.target.tagName.toLowerCase() === "button") return; // its own click
      press("submit-button");
      ev.preventDefault();
    } else if (ev.key === "j") {
      press("next-button"); ev.preventDefault();
    } else if (ev.key === "k") {
      press("prev-button"); ev.preventDefault();
    } else if (ev.key === "s") {
      press("skip-button"); ev.preventDefault();
    } else if (ev.key === "c") {
      var box = form.querySelector("textarea[name=comment]");
      if (box) { box.focus(); ev.preventDefault(); }
    }
  });
})();
