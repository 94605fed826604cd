// capdex console: live updates without a reload, and nothing else.
// The page's <main> names the event topics it follows (data-live); when one
// arrives on /events (server-sent events from the NATS events ops follow),
// the page's content is fetched again and swapped in. No framework, no build.
"use strict";
(function () {
  const main = document.getElementById("content");
  const badge = document.getElementById("live");
  if (!main) return;
  const topics = (main.dataset.live || "").split(" ").filter(Boolean);
  if (topics.length === 0 || !window.EventSource) return;

  let fetching = false;
  let again = false;
  let timer = null;

  // A form the operator is typing in is left alone; it is refreshed once the focus leaves.
  function busy() {
    const active = document.activeElement;
    return active && active !== document.body && main.contains(active) &&
      (active.tagName === "INPUT" || active.tagName === "TEXTAREA" || active.tagName === "SELECT");
  }

  async function refresh() {
    if (fetching) { again = true; return; }
    if (busy()) { schedule(500); return; }
    fetching = true;
    try {
      const response = await fetch(window.location.pathname + window.location.search, {
        headers: { "X-Console-Fragment": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.ok) {
        main.innerHTML = await response.text();
        main.dataset.refreshedAt = String(Date.now());
        document.dispatchEvent(new CustomEvent("console:refreshed"));
      } else if (response.status === 401) {
        window.location.assign("/login");
      }
    } catch (err) {
      // The next event tries again.
    } finally {
      fetching = false;
      if (again) { again = false; schedule(50); }
    }
  }

  function schedule(ms) {
    if (timer) return;
    timer = setTimeout(function () { timer = null; refresh(); }, ms);
  }

  const source = new EventSource("/events");
  source.onopen = function () { if (badge) { badge.textContent = "live"; badge.className = "live on"; } };
  source.onerror = function () { if (badge) { badge.textContent = "reconnecting"; badge.className = "live off"; } };
  for (const topic of topics.concat(["lagged"])) {
    source.addEventListener(topic, function () {
      schedule(100);
      // A decision or change may land just after its event: look once more.
      setTimeout(function () { schedule(0); }, 700);
    });
  }
})();
