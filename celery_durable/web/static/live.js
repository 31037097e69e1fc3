// What the runs page and the run page share: swapping in a fragment the
// server rendered, and one EventSource with a visible connection state.
// Data from the server only ever reaches the page as server-escaped HTML
// parsed by DOMParser, or through textContent: never through innerHTML.
"use strict";

window.DurableLive = (function () {
  function setState(state, text) {
    const badge = document.getElementById("live-state");
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = text;
  }

  async function fetchFragment(url, id) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status + " for " + url);
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = doc.getElementById(id);
    if (!fresh) throw new Error("the response has no #" + id);
    return document.adoptNode(fresh);
  }

  // At most one run of `task` at a time; calls made meanwhile fold into one more run.
  function serialized(task) {
    let running = false;
    let again = false;
    return async function () {
      if (running) {
        again = true;
        return;
      }
      running = true;
      try {
        do {
          again = false;
          await task();
        } while (again);
      } catch (error) {
        setState("error", "update failed");
        console.error(error);
      } finally {
        running = false;
      }
    };
  }

  // "live" only once the server says `ready`: it is then subscribed to the
  // run updates, so no change made from here on can be missed.
  function connect(url, handlers) {
    const source = new EventSource(url);
    source.onopen = function () { setState("off", "connecting"); };
    source.onerror = function () {
      setState(source.readyState === EventSource.CLOSED ? "off" : "error", "reconnecting");
    };
    source.addEventListener("ready", function () { setState("on", "live"); });
    for (const name of Object.keys(handlers)) {
      source.addEventListener(name, function (event) {
        handlers[name](event.data ? JSON.parse(event.data) : null, source);
      });
    }
    return source;
  }

  return { setState: setState, fetchFragment: fetchFragment, serialized: serialized, connect: connect };
})();
