"use strict";
// Fetches the server-rendered panel with the key as a bearer token, every five seconds. The
// key comes from the form or the URL fragment (never sent to the server in the URL; removed
// from the address bar once read) and stays in this tab's session storage.
(function () {
  const panel = document.getElementById("panel");
  const updated = document.getElementById("updated");
  const fromFragment = new URLSearchParams(location.hash.slice(1)).get("key");
  let key = fromFragment || sessionStorage.getItem("sluice-key") || "";
  if (fromFragment) {
    sessionStorage.setItem("sluice-key", fromFragment);
    history.replaceState(null, "", location.pathname);
  }

  async function refresh() {
    if (!key) {
      return;
    }
    try {
      const response = await fetch("/ui/panel", {
        headers: { Authorization: "Bearer " + key },
        cache: "no-store",
      });
      const body = await response.text();
      if (response.ok) {
        panel.innerHTML = body;
        updated.textContent = "updated " + new Date().toLocaleTimeString();
      } else {
        panel.textContent = "The server refused the key (" + response.status + "): " + body;
      }
    } catch (error) {
      updated.textContent = "the server is not reachable (" + error + ")";
    }
  }

  document.getElementById("login").addEventListener("submit", function (event) {
    event.preventDefault();
    key = document.getElementById("key").value;
    sessionStorage.setItem("sluice-key", key);
    refresh();
  });
  refresh();
  setInterval(refresh, 5000);
})();
