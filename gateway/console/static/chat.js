// The web chat page's only script (templates/chat.html). No inline script anywhere: the console's
// CSP forbids it. Every text from the server is set with textContent, never as markup, but for one:
// a bot message's `html`, which the server rendered from the masked text (gateway/console/markdown.py:
// no HTML of the text's own, links to http, https and mailto only, no images).
(function () {
  "use strict";
  var root = document.getElementById("chat");
  if (!root) { return; }
  var base = root.dataset.base;
  var csrf = root.dataset.csrf;
  var after = Number(root.dataset.after || "0");
  var list = document.getElementById("messages");
  var status = document.getElementById("chat-status");
  var form = document.getElementById("chat-form");

  function say(text, bad) {
    status.textContent = text || "";
    status.className = bad ? "error" : "muted";
  }

  // Every answer is JSON ({ok, error}), refusals too; anything else (a proxy's page) is shown as
  // its status, never as "did not reach the daemon" when it did.
  function read(r) {
    return r.text().then(function (body) {
      try { return JSON.parse(body); } catch (e) {
        return {ok: false, error: "The daemon answered " + r.status + ": " + body.slice(0, 200)};
      }
    });
  }

  function press(msgId, value) {
    var body = new FormData();
    body.append("csrf", csrf);
    body.append("msg", msgId);
    body.append("value", value);
    fetch(base + "/press", {method: "POST", body: body, credentials: "same-origin",
                            headers: {"Accept": "application/json"}})
      .then(read)
      .then(function (a) { say(a.text || a.error || "", !a.ok); })
      .catch(function () { say("That did not reach the daemon; press again.", true); });
  }

  function build(m) {
    var box = document.createElement("div");
    box.className = "msg msg-" + (m.role === "user" ? "user" : "bot");
    box.id = "m-" + m.id;
    box.dataset.seq = String(m.seq);
    var head = document.createElement("div");
    head.className = "msg-head";
    var who = document.createElement("span");
    who.className = "msg-author";
    who.textContent = m.role === "bot" ? "Chital" : m.author;
    var when = document.createElement("span");
    when.className = "muted";
    when.textContent = " " + m.time;
    head.appendChild(who);
    head.appendChild(when);
    box.appendChild(head);
    var text = document.createElement("div");
    if (m.role === "bot" && typeof m.html === "string") {
      text.className = "msg-text msg-md";
      text.innerHTML = m.html;
    } else {
      text.className = "msg-text";
      text.textContent = m.text;
    }
    box.appendChild(text);
    m.files.forEach(function (f) {
      var line = document.createElement("div");
      line.className = "msg-file";
      var link = document.createElement("a");
      link.href = f.url;  // built by the server under this chat's path
      link.setAttribute("download", "");
      link.textContent = "📎 " + f.name;
      line.appendChild(link);
      box.appendChild(line);
    });
    if (m.buttons.length) {
      var row = document.createElement("div");
      row.className = "msg-buttons";
      m.buttons.forEach(function (b) {
        var button = document.createElement("button");
        button.type = "button";
        button.className = "btn-" + (b.style === "primary" || b.style === "danger" ? b.style : "plain");
        button.textContent = b.label;
        button.addEventListener("click", function () { press(m.id, b.value); });
        row.appendChild(button);
      });
      box.appendChild(row);
    }
    return box;
  }

  // Buttons the server rendered: pressed through fetch too, so the page does not reload.
  Array.prototype.forEach.call(list.querySelectorAll("form.msg-buttons"), function (f) {
    f.addEventListener("submit", function (e) {
      e.preventDefault();
      var value = e.submitter ? e.submitter.value : "";
      press(f.querySelector("input[name=msg]").value, value);
    });
  });

  function show(m) {
    var old = document.getElementById("m-" + m.id);
    var box = build(m);
    if (old) { old.replaceWith(box); } else { list.appendChild(box); }
    box.scrollIntoView({block: "end"});
  }

  var source = null;
  var gone = false;
  function listen() {
    source = new EventSource(base + "/events?after=" + after);
    source.addEventListener("msg", function (e) {
      var m = JSON.parse(e.data);
      after = Math.max(after, m.seq);
      show(m);
    });
    // Too many pages open: this one's stream was closed for a newer one. Reconnecting at once
    // would close the next oldest, round and round; wait until this page is looked at again.
    source.addEventListener("closed", function () { source.close(); source = null; });
  }
  listen();
  function again() {
    if (!gone && !source && document.visibilityState === "visible") { listen(); }
  }
  document.addEventListener("visibilitychange", again);
  window.addEventListener("focus", again);
  // Leaving through the console's boosted links swaps the page without unloading it.
  document.addEventListener("htmx:beforeSwap", function () {
    gone = true;
    if (source) { source.close(); }
  });

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var body = new FormData(form);
    var send = document.getElementById("chat-send");
    send.disabled = true;
    say("Sending…", false);
    fetch(form.action, {method: "POST", body: body, credentials: "same-origin",
                        headers: {"Accept": "application/json"}})
      .then(read)
      .then(function (a) {
        if (a.ok) {
          form.elements.text.value = "";
          form.elements.files.value = "";
          form.elements.nonce.value = a.nonce;
          say("", false);
        } else {
          say(a.error, true);
        }
      })
      .catch(function () { say("That did not reach the daemon; send it again.", true); })
      .finally(function () { send.disabled = false; });
  });
})();
