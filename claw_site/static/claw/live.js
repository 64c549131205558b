/* Claw-R1 live dashboard client: one websocket to ws/live/, no dependencies.
 *
 *   ClawLive.on("steps", function (data) { ... });   // per event, with its data
 *   ClawLive.onState(function (state) { ... });      // the counters: the hello state on every
 *                                                    // (re)connect, then each "state" message
 *   ClawLive.connect(["overview", "collection"]);
 *
 * Counters only ever come from a state (one consistent read on the server, sent again after
 * events); events move rows, progress bars and the rate chart.
 *
 * Reconnects with backoff (0.5 s doubling to 5 s). Sets data-state="live"|"reconnecting"
 * (and "closed" when the server refuses: 4401 not logged in, 4403 not allowed, 4400 bad
 * topic) and a short text on #live-status when the page has one. Writes text only
 * (textContent), never HTML.
 */
(function () {
  "use strict";

  var handlers = {};
  var stateHandlers = [];
  var socket = null;
  var topics = ["overview"];
  var delay = 500;
  var timer = null;
  var MAX_DELAY = 5000;
  var REFUSED = { 4400: "unknown topic", 4401: "not logged in", 4403: "not allowed" };

  function status(state, text) {
    var el = document.getElementById("live-status");
    if (el) {
      el.setAttribute("data-state", state);
      el.textContent = text;
    }
    document.documentElement.setAttribute("data-live", state);
  }

  function emit(kind, data) {
    var list = handlers[kind] || [];
    for (var i = 0; i < list.length; i++) {
      try {
        list[i](data);
      } catch (err) {
        console.error("ClawLive handler for " + kind, err);
      }
    }
  }

  function url() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + window.location.host + "/ws/live/?topics=" + encodeURIComponent(topics.join(","));
  }

  function open() {
    timer = null;
    var ws = new WebSocket(url());
    socket = ws;
    ws.onmessage = function (msg) {
      var body;
      try {
        body = JSON.parse(msg.data);
      } catch (err) {
        return;
      }
      if (body.type === "hello" || body.type === "state") {
        if (body.type === "hello") {
          delay = 500;
          status("live", "live");
        }
        for (var i = 0; i < stateHandlers.length; i++) {
          try {
            stateHandlers[i](body.state);
          } catch (err) {
            console.error("ClawLive state handler", err);
          }
        }
      } else if (body.type === "batch") {
        for (var j = 0; j < body.events.length; j++) {
          emit(body.events[j].kind, body.events[j].data);
        }
      }
    };
    ws.onclose = function (ev) {
      if (socket !== ws) return; // replaced by a newer connect()
      socket = null;
      if (REFUSED[ev.code]) {
        status("closed", REFUSED[ev.code]);
        return; // retrying would be refused again
      }
      status("reconnecting", "reconnecting…");
      timer = window.setTimeout(open, delay);
      delay = Math.min(delay * 2, MAX_DELAY);
    };
  }

  window.ClawLive = {
    connect: function (wanted) {
      if (wanted && wanted.length) topics = wanted.slice();
      if (timer) window.clearTimeout(timer);
      if (socket) {
        var old = socket;
        socket = null;
        old.close();
      }
      delay = 500;
      status("reconnecting", "connecting…");
      open();
    },
    on: function (kind, fn) {
      (handlers[kind] = handlers[kind] || []).push(fn);
    },
    onState: function (fn) {
      stateHandlers.push(fn);
    },
    close: function () {
      if (timer) window.clearTimeout(timer);
      timer = null;
      if (socket) {
        var old = socket;
        socket = null;
        old.close();
      }
    },
  };
})();
