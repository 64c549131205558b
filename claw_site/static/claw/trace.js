/* The trace view and the step page: token views on demand (no framework, no CDN).
   A <details class="token-view" data-token-url> fetches its step's tokens when first opened;
   the step page's #token-box does the same from its button. The tokens come as JSON
   (curation/selectors/timeline.py step_token_ids): ids, each id's text when a tokenizer is
   configured, and the response's rollout logprobs. Every text goes in as textContent. */
(function () {
  "use strict";

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  // Probability p = exp(logprob) on a continuous scale: red (0) through amber to green (1).
  function colour(lp) {
    var p = Math.exp(lp);
    if (!isFinite(p)) p = 0;
    p = Math.max(0, Math.min(1, p));
    return "hsl(" + Math.round(120 * p) + ", 75%, " + Math.round(82 - 6 * p) + "%)";
  }

  // What a token's chip shows: its text with whitespace made visible, else its id.
  function shown(text) {
    if (text === "") return "∅";
    return text.replace(/\n/g, "↵\n").replace(/\t/g, "⇥").replace(/^ | $/g, "·");
  }

  function chips(box, ids, texts, logprobs) {
    ids.forEach(function (id, k) {
      var text = texts ? texts[k] : null;
      var chip = el("span", { "class": "tok" + (text === null ? " tok-id" : ""), "data-id": String(id) },
        text === null ? String(id) : shown(text));
      var title = "id " + id;
      if (logprobs && k < logprobs.length && logprobs[k] !== null) {
        chip.style.backgroundColor = colour(logprobs[k]);
        chip.dataset.logprob = String(logprobs[k]);
        title += " · logprob " + logprobs[k].toFixed(3) + " (p " + Math.exp(logprobs[k]).toFixed(3) + ")";
      }
      chip.title = title;
      // Ids are separated by spaces; decoded tokens run on as the text they make.
      if (k && !texts) box.appendChild(document.createTextNode(" "));
      box.appendChild(chip);
    });
  }

  function legend(t) {
    var box = el("div", { "class": "tok-legend small muted" });
    box.appendChild(el("span", {}, t.tokenizer ? "decoded with " + t.tokenizer + " ·" : "no tokenizer configured (CLAW_TOKENIZER): ids shown ·"));
    if (t.response_logprobs) {
      box.appendChild(el("span", {}, "response coloured by probability: "));
      box.appendChild(el("span", { "class": "tok-scale-end" }, "p 0"));
      box.appendChild(el("span", { "class": "tok-scale", "aria-hidden": "true" }));
      box.appendChild(el("span", { "class": "tok-scale-end" }, "1"));
      box.appendChild(el("span", {}, "· hover a token for its id"));
    } else {
      box.appendChild(el("span", {}, "no rollout logprobs recorded · hover a token for its id"));
    }
    return box;
  }

  function render(body, t) {
    body.textContent = "";
    body.appendChild(legend(t));
    [["prompt", t.prompt_ids, t.prompt_tokens, null], ["response", t.response_ids, t.response_tokens, t.response_logprobs]]
      .forEach(function (part) {
        body.appendChild(el("h4", {}, part[0] + " (" + part[1].length + " tokens)"));
        var box = el("div", { "class": "toks", "data-tokens": part[0] });
        chips(box, part[1], part[2], part[3]);
        body.appendChild(box);
      });
  }

  function load(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (resp) {
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      return resp.json();
    });
  }

  document.querySelectorAll("details.token-view").forEach(function (d) {
    d.addEventListener("toggle", function () {
      if (!d.open || d.dataset.loaded) return;
      d.dataset.loaded = "1";
      var body = d.querySelector(".token-body");
      load(d.dataset.tokenUrl).then(function (t) { render(body, t); }).catch(function (err) {
        delete d.dataset.loaded;
        body.textContent = "";
        body.appendChild(el("p", { "class": "error" }, "Could not load the tokens: " + err.message));
      });
    });
  });

  // The step page: a button, then the same view with the counts in the headings.
  var box = document.getElementById("token-box");
  if (box) {
    var button = document.getElementById("tokens-load");
    button.addEventListener("click", function () {
      button.disabled = true;
      load(box.dataset.url).then(function (t) {
        var view = document.getElementById("tokens-view");
        view.textContent = "";
        render(view, t);
        view.hidden = false;
        button.hidden = true;
      }).catch(function (err) {
        var e = document.getElementById("tokens-error");
        e.hidden = false;
        e.textContent = "Could not load the token ids: " + err.message;
        button.disabled = false;
      });
    });
  }
})();
