/* Adopter dashboard: keeps the state of running scans current without a reload.
   Polls the JSON API (same origin, cookie auth); does nothing when no scan on the page is running. */
(function () {
  "use strict";
  var TERMINAL = { done: 1, failed: 1, skipped: 1 };
  var INTERVAL = 1500;

  function badge(el, state) {
    el.textContent = state;
    el.className = "state state-" + state;
  }

  function text(tag, cls, content) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    el.textContent = content;
    return el;
  }

  function pollList() {
    var live = document.querySelectorAll("[data-live='1'][data-scan-id]");
    if (!live.length) return;
    var ids = Array.prototype.map.call(live, function (el) { return el.getAttribute("data-scan-id"); });
    fetch("/api/scans/states?ids=" + ids.join(","), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        Array.prototype.forEach.call(live, function (el) {
          var state = data.states[el.getAttribute("data-scan-id")];
          if (!state) return;
          badge(el, state);
          if (TERMINAL[state]) el.removeAttribute("data-live");
        });
      })
      .catch(function () {})
      .then(function () { setTimeout(pollList, INTERVAL); });
  }

  function pollScan(box) {
    var id = box.getAttribute("data-scan");
    fetch("/api/scans/" + id + "/status", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        var stateEl = document.querySelector("#scan-state .state");
        if (stateEl && stateEl.textContent !== data.state) {
          badge(stateEl, data.state);
          box.textContent = "Scan state: " + data.state;
        }
        var reason = document.getElementById("scan-reason");
        if (reason) reason.textContent = data.reason ? " — " + data.reason : "";
        var list = document.getElementById("timeline");
        if (list) {
          list.textContent = "";
          data.events.forEach(function (e) {
            var li = document.createElement("li");
            li.appendChild(text("span", "state state-" + e.state, e.state));
            li.appendChild(document.createTextNode(" " + e.at.replace("T", " ").slice(0, 19) + " UTC" +
              (e.reason ? " — " + e.reason : "")));
            list.appendChild(li);
          });
        }
        if (data.terminal) {
          box.setAttribute("data-terminal", "1");
          // The results (findings, diff, benchmark) are rendered on the server: fetch them once.
          setTimeout(function () { window.location.reload(); }, 500);
        }
      })
      .catch(function () {})
      .then(function () {
        if (box.getAttribute("data-terminal") !== "1") setTimeout(function () { pollScan(box); }, INTERVAL);
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live");
    if (box && box.getAttribute("data-terminal") === "0") {
      setTimeout(function () { pollScan(box); }, INTERVAL);
    } else {
      setTimeout(pollList, INTERVAL);
    }
  });
})();
