// Dashboard pages: live counters, rows and charts from the live events (live.js, the
// ClawLive contract), and the step inspector's token ids on demand. Pages are complete
// without it: every number is server-rendered first, and live events only move them on.
// Safety: data only ever reaches the DOM through textContent or setAttribute on attributes
// that are not URLs or handlers (hrefs are built from our own URL prefixes + encoded ids).
(function () {
  "use strict";

  function $(sel, root) { return (root || document).querySelector(sel); }
  function $all(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }
  // Numbers read as the server renders them (Django's intcomma): 12,345.
  function fmt(value) { return typeof value === "number" && isFinite(value) ? value.toLocaleString("en-US") : String(value); }
  function text(el, value) { if (el) el.textContent = value === null || value === undefined ? "–" : fmt(value); }
  function el(tag, attrs, content) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (content !== undefined && content !== null) e.textContent = String(content);
    return e;
  }
  function cssEscape(s) { return window.CSS && CSS.escape ? CSS.escape(s) : String(s).replace(/["\\]/g, "\\$&"); }

  // --- prefix tree rows: indentation from data-indent (the CSP allows no style attributes;
  // CSSOM is not an inline style) ------------------------------------------------------------
  $all("[data-indent]").forEach(function (row) {
    row.style.setProperty("--depth", String(Number(row.dataset.indent) || 0));
  });

  // --- step inspector: token ids on demand -------------------------------------------------
  var tokensBox = $("#tokens");
  if (tokensBox) {
    $("#tokens-load").addEventListener("click", function () {
      var button = this;
      button.disabled = true;
      fetch(tokensBox.dataset.url, { credentials: "same-origin" }).then(function (resp) {
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        return resp.json();
      }).then(function (t) {
        text($("[data-tokens=prompt]"), t.prompt_ids.join(" "));
        text($("[data-tokens=response]"), t.response_ids.join(" "));
        text($("[data-tokens=prompt-count]"), "(" + t.prompt_ids.length + " ids)");
        text($("[data-tokens=response-count]"), "(" + t.response_ids.length + " ids)");
        $("#tokens-view").hidden = false;
        button.hidden = true;
      }).catch(function (err) {
        var box = $("#tokens-error");
        box.hidden = false;
        text(box, "Could not load the token ids: " + err.message);
        button.disabled = false;
      });
    });
  }

  // --- live ---------------------------------------------------------------------------------
  var script = document.getElementById("dashboard-script");
  var topics = script && script.dataset.topics ? script.dataset.topics.split(",") : [];
  if (!topics.length) return;
  var status = $("#live-status");
  if (!window.ClawLive) {
    if (status) { status.dataset.state = "off"; text(status, "live updates unavailable"); }
    return;
  }
  var Live = window.ClawLive;

  // Counters: every [data-live="stage.key"] element holds one number of the state (the hello
  // state, then each "state" message: one consistent read on the server). They are set from
  // it only, never moved by adding up events, so they always agree with each other.
  function setCounter(path, value) {
    $all("[data-live='" + path + "']").forEach(function (e) {
      text(e, value === null || value === undefined ? value : fmt(value) + (e.dataset.suffix || ""));
    });
    // The word after a count agrees with it: "1 consumer", "2 consumers".
    $all("[data-plural='" + path + "']").forEach(function (e) {
      e.textContent = value === 1 ? e.dataset.one : e.dataset.many;
    });
  }
  function applyState(state, prefix) {
    Object.keys(state || {}).forEach(function (k) {
      var v = state[k], path = prefix ? prefix + "." + k : k;
      if (v !== null && typeof v === "object" && !Array.isArray(v)) applyState(v, path);
      else if (!Array.isArray(v)) setCounter(path, v);
    });
  }
  Live.onState(function (state) {
    applyState(state, "");
    var pct = $("#optimize-pct");
    if (pct && state && state.optimize) {
      text(pct, state.optimize.saved_pct === null ? "nothing merged yet" : fmt(state.optimize.saved_pct) + "% saved");
    }
    ((state && state.collect && state.collect.sources) || []).forEach(function (s) {
      sourceRows(s.name).forEach(function (row) {
        text($("[data-cell=steps]", row), s.steps);
        text($("[data-cell=trajectories]", row), s.trajectories);
      });
    });
  });

  // Sources: [data-source=name] rows with trajectories, steps and last-seen cells.
  function sourceRows(name) { return $all("tr[data-source='" + cssEscape(name) + "']"); }
  function touchSource(name) {
    sourceRows(name).forEach(function (row) { text($("[data-cell=last_seen]", row), "just now"); });
  }

  // Live rows of a filtered table: an item is shown when it matches every data-filter-*.
  function matches(table, item) {
    return Object.keys(table.dataset).every(function (k) {
      if (k.indexOf("filter") !== 0) return true;
      var want = table.dataset[k], field = k.slice(6);
      field = field.charAt(0).toLowerCase() + field.slice(1);
      if (!want) return true;
      if (field === "drift") return !!item.drift;
      return String(item[field] === null || item[field] === undefined ? "" : item[field]) === want;
    });
  }
  function prepend(tbody, row, keep) {
    var empty = $("tr.empty-row", tbody);
    if (empty) empty.remove();
    row.className = "live-new";
    tbody.insertBefore(row, tbody.firstChild);
    while (tbody.rows.length > keep) tbody.deleteRow(tbody.rows.length - 1);
  }
  function link(href, label) { var a = el("a", { href: href }, label); return a; }
  // cls: "opt" for a column a narrow screen leaves out (claw.css), as the server's rows do.
  function cell(content, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    if (content instanceof Node) td.appendChild(content); else td.textContent = content === null || content === undefined ? "–" : fmt(content);
    return td;
  }

  // Collection: trajectories from `steps` (touched) and `trajectories.completed`.
  var trajTable = $("table#trajectories[data-live-rows]");
  function upsertTrajectory(t) {
    if (!trajTable || !matches(trajTable, t)) return;
    var tbody = trajTable.tBodies[0];
    var row = $("tr[data-uid='" + cssEscape(t.uid) + "']", tbody);
    if (row) {
      text($("[data-cell=step_count]", row), t.step_count);
      var badge = $(".badge", row);
      if (badge) { text(badge, t.status); badge.className = "badge " + t.status.replace(/[^a-z]/g, ""); }
      return;
    }
    row = el("tr", { "data-uid": t.uid });
    var badgeEl = el("span", { "class": "badge " + String(t.status).replace(/[^a-z]/g, "") }, t.status);
    row.appendChild(cell(link(trajTable.dataset.trajectoryUrl + encodeURIComponent(t.uid) + "/", t.uid)));
    row.appendChild(cell(badgeEl));
    row.appendChild(cell(t.channel, "opt"));
    row.appendChild(cell(t.source, "opt"));
    row.appendChild(cell(t.group ? link(trajTable.dataset.groupUrl + encodeURIComponent(t.group) + "/", t.group) : null));
    var steps = cell(t.step_count); steps.dataset.cell = "step_count"; row.appendChild(steps);
    row.appendChild(cell(null));
    row.appendChild(cell(new Date().toISOString().slice(0, 19).replace("T", " "), "opt"));
    prepend(tbody, row, 100);
  }

  // Representation: the newest steps from `steps.recent`, each linking to its step page and
  // its trajectory, with its token counts (prompt + response), as the server renders them.
  var stepTable = $("table#steps[data-live-rows]");
  function addStep(s) {
    if (!stepTable || !matches(stepTable, s)) return;
    var tbody = stepTable.tBodies[0];
    if ($("tr[data-step-id='" + cssEscape(String(s.id)) + "']", tbody)) return;
    var row = el("tr", { "data-step-id": String(s.id) });
    row.appendChild(cell(link(stepTable.dataset.stepUrl + encodeURIComponent(String(s.id)) + "/", s.uid), "nowrap"));
    row.appendChild(cell(link(stepTable.dataset.trajectoryUrl + encodeURIComponent(s.trajectory) + "/", s.trajectory), "nowrap"));
    row.appendChild(cell(String(s.step_index), "opt"));
    row.appendChild(cell(s.source || null, "opt"));
    var tokens = cell(s.prompt_len === undefined ? null : fmt(s.prompt_len) + " + " + fmt(s.response_len), "nowrap");
    tokens.dataset.cell = "tokens";
    row.appendChild(tokens);
    row.appendChild(cell(el("span", { "class": "badge" + (s.token_source === "retokenized" ? " warn" : "") }, s.token_source)));
    row.appendChild(cell(s.drift ? el("span", { "class": "badge warn" }, "drift") : null));
    row.appendChild(cell(null));
    row.appendChild(cell(new Date().toISOString().slice(0, 19).replace("T", " "), "opt"));
    prepend(tbody, row, 100);
  }

  Live.on("steps", function (d) {
    Object.keys(d.by_source || {}).forEach(touchSource);
    (d.trajectories || []).slice().reverse().forEach(upsertTrajectory);
    (d.recent || []).slice().reverse().forEach(addStep);
  });
  Live.on("trajectories.completed", function (d) {
    (d.items || []).forEach(upsertTrajectory);
  });

  // Optimization: a group's row shows its latest merge (the totals come with the state).
  Live.on("merge", function (d) {
    (d.items || []).forEach(function (m) {
      var row = $("tr[data-group='" + cssEscape(m.group) + "']");
      if (row) {
        text($("[data-cell=tokens]", row), m.tokens);
        text($("[data-cell=saved]", row), m.tokens_saved + (m.tokens ? " (" + Math.round(100 * m.tokens_saved / m.tokens) + "%)" : ""));
      }
    });
  });

  // Consumption: snapshot progress bars and leases.
  var snapshotRows = $("#snapshot-rows");
  function snapshotRow(d) {
    // A snapshot requested elsewhere (the API, another operator): a row of its own.
    var row = el("tr", { "data-snapshot": String(d.id), "data-status": "" });
    row.appendChild(cell(el("code", { title: String(d.id) }, String(d.id).slice(0, 8))));
    row.appendChild(cell("new"));
    var status = el("span", { "class": "badge", "data-cell": "status" }, "");
    row.appendChild(cell(status));
    var progress = cell(el("progress", { max: "1", value: "0" }));
    progress.className = "progress-cell";
    progress.appendChild(document.createTextNode(" "));
    progress.appendChild(el("span", { "class": "small muted", "data-cell": "steps" }, ""));
    row.appendChild(progress);
    var files = cell(null); files.dataset.cell = "files"; row.appendChild(files);
    row.appendChild(cell(new Date().toISOString().slice(0, 19).replace("T", " ")));
    prepend(snapshotRows, row, 50);
    return row;
  }
  Live.on("snapshot", function (d) {
    var row = $("tr[data-snapshot='" + cssEscape(String(d.id)) + "']");
    if (!row && snapshotRows) row = snapshotRow(d);
    if (!row || row.dataset.status === "done") return; // a done snapshot never changes
    var bar = $("progress", row);
    if (bar) { bar.max = 1; bar.value = Math.max(0, Math.min(1, Number(d.progress) || 0)); }
    row.dataset.status = d.status;
    var badge = $("[data-cell=status]", row);
    text(badge, d.status);
    if (badge) badge.className = "badge " + String(d.status).replace(/[^a-z]/g, "");
    if (d.steps !== undefined && d.steps !== null) text($("[data-cell=steps]", row), fmt(d.steps) + " steps");
    if (d.status === "done") {
      if (bar) bar.value = 1;
      var files = $("[data-cell=files]", row);
      if (files && !$("a", files)) {
        files.textContent = "";
        var base = "/api/v1/snapshots/" + encodeURIComponent(String(d.id)) + "/download?format=";
        files.appendChild(link(base + "jsonl", "jsonl"));
        files.appendChild(document.createTextNode(" · "));
        files.appendChild(link(base + "parquet", "parquet"));
      }
    }
  });
  Live.on("lease", function (d) {
    (d.items || []).forEach(function (l) {
      var row = $("tr[data-lease='" + cssEscape(String(l.id)) + "']");
      if (row) text($("[data-cell=status]", row), l.status);
    });
  });

  // Overview: the ingestion-rate chart (steps per minute; the last point is this minute,
  // estimated from `rate` events: each process sends its steps/s once per second, so the
  // sum of a minute's events over the seconds seen is the pool's rate).
  var chart = $("#rate-chart");
  if (chart) {
    var line = $("polyline.line", chart), area = $("polygon.area", chart);
    var values = (chart.dataset.values || "").split(",").filter(Boolean).map(Number);
    if (!values.length) values = [0];
    var viewW = Number(chart.dataset.viewW), top = Number(chart.dataset.top), bottom = Number(chart.dataset.bottom);
    var ticks = $all("[data-tick]", chart), unit = chart.dataset.unit || "";
    var scaleTop = Number(chart.dataset.scaleTop) || 1;
    // The time labels (HH:MM) move on with the minutes, as the points do.
    var shiftTimes = function (minutes) {
      $all("[data-time]", chart).forEach(function (t) {
        var hm = t.textContent.split(":").map(Number);
        if (hm.length !== 2 || isNaN(hm[0]) || isNaN(hm[1])) return;
        var total = ((hm[0] * 60 + hm[1] + minutes) % 1440 + 1440) % 1440;
        t.textContent = ("0" + Math.floor(total / 60)).slice(-2) + ":" + ("0" + total % 60).slice(-2);
      });
    };
    // The y axis keeps its grid lines; when the peak passes the scale, the scale grows to the
    // next round step (1, 2, 2.5 or 5 × 10^k per grid line) and the tick labels follow.
    var rescale = function (peak) {
      var steps = ticks.length - 1, raw = peak / steps, mag = Math.pow(10, Math.floor(Math.log10(raw)));
      var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * mag; }).filter(function (v) { return v >= raw; })[0];
      if (step < 1) step = 1;
      scaleTop = step * steps;
      ticks.forEach(function (t, i) { t.textContent = fmt(step * i) + (i === steps ? " " + unit : ""); });
    };
    var minute = Math.floor(Date.now() / 60000), seconds = {}, sum = 0, second = 0, secondSum = 0;
    var redraw = function () {
      var peak = Math.max.apply(null, values.concat([0])), n = Math.max(values.length - 1, 1);
      if (peak > scaleTop) rescale(peak);
      var pts = values.map(function (v, i) {
        return (viewW * i / n).toFixed(1) + "," + (top + (bottom - top) * (1 - v / scaleTop)).toFixed(1);
      }).join(" ");
      line.setAttribute("points", pts);
      area.setAttribute("points", "0," + bottom + " " + pts + " " + viewW + "," + bottom);
      text($("[data-chart=max]", chart), Math.round(peak));
    };
    Live.on("rate", function (d) {
      var now = Date.now(), m = Math.floor(now / 60000), s = Math.floor(now / 1000);
      if (m !== minute) {
        for (var k = minute; k < m && k < minute + values.length; k++) { values.push(0); values.shift(); }
        shiftTimes(m - minute);
        minute = m; seconds = {}; sum = 0;
      }
      seconds[s] = true;
      sum += Number(d.steps_per_s) || 0;
      if (s !== second) { second = s; secondSum = 0; }
      secondSum += Number(d.steps_per_s) || 0;
      values[values.length - 1] = Math.round(60 * sum / Object.keys(seconds).length);
      text($("#rate-now"), secondSum.toFixed(1));
      redraw();
    });
  }

  Live.connect(topics);
})();
