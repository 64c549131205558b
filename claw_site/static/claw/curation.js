// Curation builder: the spec of the form (its common fields, or the JSON textarea when
// "advanced" is checked) is POSTed to the preview endpoint as the form changes (debounced),
// and the numbers it returns replace the page's. No dependencies.
(function () {
  "use strict";
  var form = document.getElementById("builder");
  if (!form) return;
  var url = form.getAttribute("data-preview-url"); // not form.dataset: a field named "dataset" shadows it
  var textarea = form.querySelector("textarea[name=spec]");
  var advanced = form.querySelector("input[name=advanced]");
  var errorBox = document.getElementById("preview-error");
  var state = document.getElementById("preview-state");
  var token = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  var timer = null;
  var seq = 0;

  function csv(text) {
    return text.split(",").map(function (s) { return s.trim(); }).filter(Boolean);
  }

  // The same mapping as curation/forms.py DatasetForm.spec_raw (data-spec, data-kind).
  function specFromFields() {
    var spec = { filters: {}, grouping: {}, serving: {} };
    var seen = {};
    form.querySelectorAll("[data-spec]").forEach(function (el) {
      var path = el.dataset.spec.split("."), kind = el.dataset.kind, value;
      if (seen[el.dataset.spec]) return;
      seen[el.dataset.spec] = true;
      if (kind === "multi" || kind === "list") {
        value = Array.prototype.map.call(
          form.querySelectorAll("[data-spec='" + el.dataset.spec + "']:checked"),
          function (c) { return c.value; });
        if (kind === "multi" && !value.length) value = null;
      } else if (kind === "bool") {
        value = el.checked;
      } else if (kind === "csv") {
        value = csv(el.value);
        if (!value.length) value = null;
      } else if (el.value.trim() === "") {
        value = null;
      } else if (kind === "int" || kind === "float") {
        value = Number(el.value);
      } else {
        value = el.value;
      }
      if (value === null) return;
      if (path.length === 3) {  // a nested struct: serving.reuse.max_uses
        spec[path[0]][path[1]] = spec[path[0]][path[1]] || {};
        spec[path[0]][path[1]][path[2]] = value;
      } else {
        spec[path[0]][path[1]] = value;
      }
    });
    return spec;
  }

  function currentSpec() {
    if (advanced.checked) return textarea.value.trim() || "{}";
    var spec = specFromFields();
    textarea.value = JSON.stringify(spec, null, 2);
    return textarea.value;
  }

  function show(numbers) {
    var est = numbers.estimate; // null: counted exactly; else estimated from a sample
    Object.keys(numbers).forEach(function (key) {
      var dd = document.querySelector("[data-preview='" + key + "']");
      if (!dd) return;
      var v = numbers[key];
      dd.textContent = v === null ? "–" : (typeof v === "number" && !Number.isInteger(v) ? v.toFixed(1) : (typeof v === "number" ? (est && key !== "current_policy_version" ? "≈ " : "") + v.toLocaleString("en-US") : String(v)));
    });
    var note = document.getElementById("preview-estimate");
    if (note) {
      note.hidden = !est;
      note.textContent = est ? "Estimated from a sample of " + est.units_sampled.toLocaleString("en-US") + " units (steps ± " + est.margins.steps.toLocaleString("en-US") + "); a saved dataset is counted exactly." : "";
    }
  }

  function refresh() {
    var mine = ++seq;
    state.textContent = "updating…";
    fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token },
      credentials: "same-origin",
      body: currentSpec()
    }).then(function (resp) {
      return resp.json().then(function (body) { return { ok: resp.ok, body: body }; });
    }).then(function (r) {
      if (mine !== seq) return; // a newer request is on its way
      state.textContent = "";
      if (r.ok) {
        errorBox.hidden = true;
        show(r.body);
      } else {
        errorBox.hidden = false;
        errorBox.textContent = (r.body.field ? r.body.field + ": " : "") + r.body.error;
      }
    }).catch(function () {
      if (mine === seq) state.textContent = "preview unavailable";
    });
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }

  form.addEventListener("input", function (ev) {
    if (ev.target === textarea) advanced.checked = true;
    if (ev.target.name === "name" || ev.target.name === "description") return;
    schedule();
  });
  form.addEventListener("change", function (ev) {
    if (ev.target.name === "name" || ev.target.name === "description") return;
    schedule();
  });
  if (!advanced.checked) currentSpec();
})();
