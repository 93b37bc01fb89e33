// Live progress of a running gate: poll the JSON API every second, update the phase and the
// progress bar in place, append the phases recorded since the last poll to the phases table,
// and reload once when the gate has finished (to show its report).
// Text only (textContent), never markup: every value may come from an engine.
(function () {
  "use strict";
  var root = document.getElementById("live");
  if (!root) { return; }
  var url = root.getAttribute("data-poll");
  var FINISHED = ["complete", "error", "cancelled"];
  var bar = document.getElementById("live-bar");
  var text = document.getElementById("live-text");
  var phase = document.getElementById("live-phase");
  var state = document.getElementById("live-state");
  var note = document.getElementById("live-note");
  var delay = 1000;
  var reloading = false;
  var rows = document.getElementById("live-phases");
  var after = rows ? Number(rows.getAttribute("data-after")) || 0 : 0;

  function cell(row, value, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    td.textContent = value;
    row.appendChild(td);
  }

  function addPhases(list) {
    for (var i = 0; i < list.length; i++) {
      var p = list[i];
      if (p.id <= after) { continue; }
      var tr = document.createElement("tr");
      cell(tr, Number(p.at_s).toFixed(2) + " s", "num");
      cell(tr, String(p.role), "");
      cell(tr, String(p.phase), "mono");
      cell(tr, p.detail === null || p.detail === undefined ? "" : String(p.detail), "mono");
      rows.appendChild(tr);
      after = p.id;
    }
  }

  function pollPhases() {
    if (!rows) { return Promise.resolve(); }
    var u = rows.getAttribute("data-poll") + "?after=" + after;
    return fetch(u, {headers: {"Accept": "application/json"}, credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(addPhases);
  }

  function describe(g) {
    var p = g.progress;
    if (p && p.scenario !== null && p.scenario !== undefined) {
      var done = p.done || 0, total = p.total || 0;
      if (total > 0) {
        var pct = Math.max(0, Math.min(100, Math.round(100 * done / total)));
        return {pct: pct, text: "scenario " + p.scenario + ": " + done + " of " + total + " responses (" + pct + "%)"};
      }
      return {pct: null, text: "scenario " + p.scenario + ": " + done + " responses"};
    }
    if (g.state === "pending") { return {pct: null, text: "waiting for a worker"}; }
    return {pct: null, text: "phase " + g.phase};
  }

  function render(g) {
    var d = describe(g);
    if (state.textContent !== g.state) { state.textContent = g.state; }
    if (phase.textContent !== g.phase) { phase.textContent = g.phase; }
    if (text.textContent !== d.text) { text.textContent = d.text; }
    if (d.pct === null) { bar.removeAttribute("value"); } else { bar.value = d.pct; }
    root.setAttribute("data-state", g.state);
  }

  function schedule() { window.setTimeout(tick, delay); }

  function tick() {
    fetch(url, {headers: {"Accept": "application/json"}, credentials: "same-origin", cache: "no-store"})
      .then(function (r) {
        if (r.status === 401) {  // the sign-in expired: sign in again, then come back here
          window.location.assign("/login?next=" + encodeURIComponent(window.location.pathname));
          throw new Error("signed out");
        }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (g) {
        return pollPhases().then(function () { return g; });
      })
      .then(function (g) {
        delay = 1000;
        render(g);
        if (FINISHED.indexOf(g.state) >= 0) {
          if (!reloading) {
            reloading = true;
            note.textContent = "The gate has finished: loading its report.";
            window.location.reload();
          }
          return;
        }
        schedule();
      })
      .catch(function (e) {
        note.textContent = "Live updates paused (" + e.message + "); retrying.";
        delay = Math.min(delay * 2, 15000);
        schedule();
      });
  }

  schedule();
})();
