// specli's chat page: the conversation, sent whole to /v1/chat/completions at every turn (the server keeps
// its KV cache across turns), each reply streamed in the terminal's colours: where every token came from.
"use strict";

// The drafter registry's colours (rich's names) as CSS colours.
const CSS_COLOURS = {green: "var(--accepted)", yellow: "var(--corrected)", cyan: "var(--bonus)",
                     magenta: "#d67ad6", blue: "#6aa0f8", red: "#f0707a",
                     bright_magenta: "#f29bf2", bright_blue: "#9cc2ff", dark_orange: "#f5a05a",
                     bright_green: "#a6e57a"};
const ORIGINS = ["accepted", "corrected", "bonus", "plain"];

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem("specli-api-key") || "",
  props: null,
  messages: [],       // the conversation as the model sees it
  busy: false,
  completionId: null, // the running reply's id, for the stop button
  controller: null,
  stopping: false,
  modeChosen: false,  // the user picked a mode: a base model's default ("continue text") stays out of it
};

function headers() {
  const h = {"Content-Type": "application/json"};
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

function cssColour(name) {
  return CSS_COLOURS[name] || name;
}

// -- the server's facts ---------------------------------------------------------------------------------

async function loadProps() {
  let response;
  try {
    response = await fetch("/specli/props", {headers: headers()});
  } catch (e) {
    $("model").textContent = "cannot reach the server";
    return;
  }
  if (response.status === 401) {
    $("key-bar").hidden = false;
    $("model").textContent = "API key needed";
    if (state.key) $("key-error").textContent = "this key was refused";
    return;
  }
  if (response.status === 503) {  // still loading: ask again shortly
    $("model").textContent = "loading the model…";
    setTimeout(loadProps, 1000);
    return;
  }
  if (!response.ok) {
    $("model").textContent = "the server answered " + response.status;
    return;
  }
  state.props = await response.json();
  $("key-bar").hidden = true;
  $("key-error").textContent = "";
  showProps(state.props);
}

// What a base model continues well: a text that repeats itself, where n-gram lookup drafts long runs.
const EXAMPLE = "Day 1: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
  + "train to the office, answered my email, ate lunch at noon and took the train home.\n"
  + "Day 2: I woke up at seven, made coffee, fed the cat, read the news, walked to the station, took the "
  + "train to the office, answered my email, ate lunch at noon and took the train home.\nDay 3:";

function showProps(props) {
  const drafter = props.drafter ? (props.draft ? props.draft : props.drafter) : "no draft";
  $("model").textContent = props.model + " · " + drafter + " · context " + props.n_ctx;
  // A GGUF without a chat template is most likely a base model: it continues text rather than answering.
  if (props.base_model) {
    $("base-text").textContent = props.model + " has no chat template, as base models (not tuned to chat) "
      + "usually do: it continues text rather than answering questions. In \u201ccontinue text\u201d mode it "
      + "carries on what you write; chat mode uses " + props.chat_template + ".";
    $("base-note").hidden = false;
    if (!state.modeChosen) $("mode").value = "continue";
  }
  updateMode();
  const d = props.defaults;
  if ($("temperature").value === "") $("temperature").placeholder = d.temperature;
  if ($("draft-max").value === "") $("draft-max").placeholder = d["speculative.n_max"];
  if ($("max-tokens").value === "") $("max-tokens").placeholder = d.max_tokens;
  const legend = $("legend");
  legend.textContent = "";
  if (!props.drafter) {
    legend.hidden = true;
    return;
  }
  // As the terminal: one colour per source when the drafter has several (combined drafting).
  const entries = props.sources.length > 1
    ? props.sources.map((s) => [cssColour(s.colour), "accepted (" + s.name + ")"])
    : [["var(--accepted)", "accepted draft"]];
  entries.push(["var(--corrected)", "target's correction"], ["var(--bonus)", "bonus (all drafts accepted)"],
               ["var(--text)", "plain (nothing drafted)"]);
  for (const [colour, label] of entries) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = colour;
    item.append(swatch, label);
    legend.append(item);
  }
  legend.hidden = false;
}

// -- the conversation -----------------------------------------------------------------------------------

function addTurn(role, text) {
  const turn = document.createElement("div");
  turn.className = "turn " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "you" : (state.props ? state.props.model : "model");
  const body = document.createElement("div");
  body.className = role === "user" ? "text" : "reply";
  body.textContent = text;  // never HTML: the user's and the model's text are shown as written
  turn.append(who, body);
  if (role === "assistant") {
    const stats = document.createElement("div");
    stats.className = "stats";
    turn.append(stats);
  }
  $("conversation").append(turn);
  scrollDown();
  return turn;
}

function scrollDown() {
  const main = $("conversation");
  main.scrollTop = main.scrollHeight;
}

// Tokens arrive faster than a page can lay them out one by one: they are added to the reply (and the view
// scrolled) in batches, at most every few milliseconds.
const pending = {reply: null, fragment: document.createDocumentFragment(), timer: null};

function appendToken(reply, text, origin, drafter) {
  if (pending.reply !== reply) flushTokens();
  pending.reply = reply;
  const span = document.createElement("span");
  span.className = "tok " + (ORIGINS.includes(origin) ? origin : "plain");
  if (origin === "accepted" && drafter && state.props && state.props.sources.length > 1) {
    const source = state.props.sources.find((s) => s.name === drafter);
    if (source) span.style.color = cssColour(source.colour);
  }
  if (drafter) span.dataset.drafter = drafter;
  span.textContent = text;
  pending.fragment.append(span);
  if (pending.timer === null) pending.timer = setTimeout(flushTokens, 30);
}

function flushTokens() {
  if (pending.timer !== null) clearTimeout(pending.timer);
  pending.timer = null;
  if (pending.reply && pending.fragment.childNodes.length) {
    pending.reply.append(pending.fragment);
    scrollDown();
  }
  pending.fragment = document.createDocumentFragment();
}

// The reply's figures, in parts joined by " · "; -k auto's reason for decoding plainly is a span in the
// correction's colour, so a reply without colours says why it has none.
function statsLine(timings, figures) {
  const parts = [];
  const n = timings.predicted_n;
  parts.push(n + (n === 1 ? " token" : " tokens"));
  parts.push(timings.predicted_per_second.toFixed(1) + " tok/s");
  const autoReason = figures ? figures.auto_reason : null;
  if (timings.draft_n) {
    const rate = 100 * timings.draft_n_accepted / timings.draft_n;
    parts.push("acceptance " + rate.toFixed(0) + "% (" + timings.draft_n_accepted + "/" + timings.draft_n
               + " drafted)");
  } else if (figures && figures.drafter && !autoReason) {
    parts.push("acceptance n/a (0/0 drafted)");
  }
  if (autoReason) {
    const auto = document.createElement("span");
    auto.className = "auto";
    auto.textContent = "auto: " + autoReason;
    parts.push(auto);
  }
  if (figures && figures.predicted_speedup != null) {
    parts.push("speedup predicted " + figures.predicted_speedup.toFixed(2) + "×");
  }
  parts.push("prompt " + timings.prompt_n + " new + " + timings.cache_n + " cached");
  const reason = figures ? figures.stop_reason : "";
  if (reason === "interrupted") parts.push("stopped");
  else if (reason === "length") parts.push("hit max tokens");
  else if (reason === "context") parts.push("context full");
  return parts;
}

function showStats(element, timings, figures) {
  element.textContent = "";
  statsLine(timings, figures).forEach((part, i) => {
    if (i) element.append(" · ");
    element.append(part);  // a text, or the reason's span: never HTML
  });
}

function continuing() {
  return $("mode").value === "continue";
}

function updateMode() {
  $("message").placeholder = continuing()
    ? "Text for the model to continue (Enter sends, Shift+Enter for a new line)"
    : "Message (Enter sends, Shift+Enter for a new line)";
}

function requestBody(prompt) {
  const body = {
    model: state.props ? state.props.model : "specli",
    stream: true,
    stream_options: {include_usage: true},
  };
  if (prompt === undefined) body.messages = state.messages;
  else body.prompt = prompt;
  const temperature = $("temperature").value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  const k = $("draft-max").value.trim();
  if (k !== "") body["speculative.n_max"] = /^\d+$/.test(k) ? Number(k) : k;
  const maxTokens = $("max-tokens").value.trim();
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return body;
}

async function send(text) {
  const prompt = continuing() ? text : undefined;  // continue text: one completion, no conversation
  if (prompt === undefined) state.messages.push({role: "user", content: text});
  addTurn("user", text);
  const turn = addTurn("assistant", "");
  const reply = turn.querySelector(".reply");
  const stats = turn.querySelector(".stats");
  reply.classList.add("waiting");
  setBusy(true);
  let content = "";
  let finished = false;
  state.controller = new AbortController();
  try {
    const route = prompt === undefined ? "/v1/chat/completions" : "/v1/completions";
    const response = await fetch(route, {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody(prompt)), signal: state.controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({error: {message: response.statusText}}));
      if (response.status === 401) loadProps();
      throw new Error(error.error ? error.error.message : "the server answered " + response.status);
    }
    for await (const chunk of events(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.id) state.completionId = chunk.id;
      const choice = chunk.choices && chunk.choices[0];
      const piece = choice ? (choice.delta ? choice.delta.content : choice.text) : "";
      if (piece) {
        content += piece;
        appendToken(reply, piece, chunk.origin, chunk.drafter);
      }
      if (chunk.timings) {
        flushTokens();
        showStats(stats, chunk.timings, chunk.speculation);
        finished = true;
      }
    }
    if (!finished) stats.textContent = "the reply ended without its figures";
  } catch (e) {
    if (e.name === "AbortError") {
      stats.textContent = "stopped (the connection was closed)";
    } else {
      const error = document.createElement("div");
      error.className = "error";
      error.textContent = e.message;
      turn.append(error);
    }
  } finally {
    flushTokens();
    reply.classList.remove("waiting");
    // The reply, also a stopped one, is part of the conversation (as in `specli chat`).
    if (prompt !== undefined) { /* continue text: nothing to keep */ }
    else if (content || finished) state.messages.push({role: "assistant", content: content});
    else state.messages.pop();  // nothing came back: the next message is sent without this one
    state.completionId = null;
    state.controller = null;
    setBusy(false);
  }
}

// Server-sent events: `data: {json}` blocks separated by blank lines; `:` lines are keep-alives.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function stop() {
  if (state.stopping) return;
  state.stopping = true;
  $("stop").disabled = true;
  const id = state.completionId;
  let asked = false;
  if (id) {
    try {
      const response = await fetch("/specli/cancel/" + encodeURIComponent(id), {method: "POST", headers: headers()});
      asked = response.ok;
    } catch (e) {
      asked = false;
    }
  }
  // The server ends the stream with the reply's figures; if it could not be asked, close the connection,
  // which stops the generation too.
  if (!asked && state.controller) state.controller.abort();
  state.stopping = false;
}

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  $("stop").disabled = false;
}

// -- wiring ---------------------------------------------------------------------------------------------

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("message").value;
  if (state.busy || !text.trim()) return;
  $("message").value = "";
  send(text);
});
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", stop);
$("mode").addEventListener("change", () => {
  state.modeChosen = true;
  updateMode();
});
$("example").addEventListener("click", () => {
  $("mode").value = "continue";
  updateMode();
  $("message").value = EXAMPLE;
  $("message").focus();
});
$("new-chat").addEventListener("click", () => {
  if (state.busy) return;
  state.messages = [];
  $("conversation").textContent = "";
});
$("use-key").addEventListener("click", () => {
  state.key = $("api-key").value.trim();
  sessionStorage.setItem("specli-api-key", state.key);
  loadProps();
});
$("api-key").addEventListener("keydown", (event) => {
  if (event.key === "Enter") $("use-key").click();
});
loadProps();
