// A small stand-in for the browser's DOM, enough for the session page's views
// (static/qwenweb/frame_log.js, transcript.js, session_status.js, session_snapshot.js)
// under Node: elements with children, text, classList, dataset, rows. Not a test file
// (node --test runs *.test.mjs only).
//
// classList checks its tokens as browsers do (DOMTokenList): an empty token is a
// SyntaxError, one with whitespace an InvalidCharacterError, so a class name built from
// something that is not a short word fails here as it fails in Chromium.

const WHITESPACE = /[\t\n\f\r ]/;

class DOMException extends Error {
  constructor(message, name) {
    super(message);
    this.name = name;
  }
}

function checkToken(token) {
  const value = String(token);
  if (value === "") throw new DOMException("The token provided must not be empty.", "SyntaxError");
  if (WHITESPACE.test(value)) {
    throw new DOMException(
      `The token provided ('${value}') contains HTML space characters, which are not valid in tokens.`,
      "InvalidCharacterError",
    );
  }
  return value;
}

class FakeClassList {
  constructor(element) {
    this.element = element;
  }

  get tokens() {
    return this.element._classes;
  }

  add(...tokens) {
    for (const token of tokens.map(checkToken)) if (!this.tokens.includes(token)) this.tokens.push(token);
  }

  remove(...tokens) {
    const gone = new Set(tokens.map(checkToken));
    this.element._classes = this.tokens.filter((token) => !gone.has(token));
  }

  toggle(token, force) {
    const on = force ?? !this.contains(token);
    if (on) this.add(token);
    else this.remove(token);
    return on;
  }

  contains(token) {
    return this.tokens.includes(String(token));
  }
}

class FakeText {
  constructor(data) {
    this.nodeType = 3;
    this.data = String(data);
    this.parent = null;
  }

  get textContent() {
    return this.data;
  }

  set textContent(value) {
    this.data = String(value);
  }

  appendData(text) {
    this.data += text;
  }

  get isConnected() {
    return this.parent !== null;
  }

  remove() {
    if (this.parent !== null) this.parent._detach(this);
  }
}

class FakeElement {
  constructor(tag) {
    this.nodeType = 1;
    this.tagName = tag.toUpperCase();
    this.childNodes = [];
    this.parent = null;
    this._classes = [];
    this.classList = new FakeClassList(this);
    this.dataset = {};
    this.attributes = {};
    this.title = "";
    this.hidden = false;
    this.disabled = false;
    this.value = "";
    this.id = "";
    this.scrollTop = 0;
    this.scrollHeight = 0;
    this.clientHeight = 0;
    this.listeners = {};
  }

  get className() {
    return this._classes.join(" ");
  }

  set className(value) {
    this._classes = String(value).split(WHITESPACE).filter(Boolean);
  }

  get children() {
    return this.childNodes.filter((node) => node.nodeType === 1);
  }

  get textContent() {
    return this.childNodes.map((node) => node.textContent).join("");
  }

  set textContent(value) {
    this.replaceChildren(new FakeText(value));
  }

  get isConnected() {
    return this.parent !== null;
  }

  _adopt(node) {
    const child = typeof node === "string" ? new FakeText(node) : node;
    if (child.parent !== null) child.parent._detach(child);
    child.parent = this;
    return child;
  }

  _detach(node) {
    this.childNodes = this.childNodes.filter((child) => child !== node);
    node.parent = null;
  }

  append(...nodes) {
    for (const node of nodes) this.childNodes.push(this._adopt(node));
  }

  prepend(...nodes) {
    this.childNodes.unshift(...nodes.map((node) => this._adopt(node)));
  }

  before(...nodes) {
    if (this.parent === null) return;
    const siblings = this.parent.childNodes;
    const adopted = nodes.map((node) => this.parent._adopt(node));
    siblings.splice(siblings.indexOf(this), 0, ...adopted);
  }

  replaceChildren(...nodes) {
    for (const child of this.childNodes) child.parent = null;
    this.childNodes = [];
    this.append(...nodes);
  }

  remove() {
    if (this.parent !== null) this.parent._detach(this);
  }

  closest() {
    return null;
  }

  querySelector() {
    return null;
  }

  setAttribute(name, value) {
    this.attributes[name] = String(value);
  }

  getAttribute(name) {
    return this.attributes[name] ?? null;
  }

  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }

  removeEventListener() {}

  /** A table section's rows (`HTMLTableSectionElement.rows`). */
  get rows() {
    return this.children.filter((child) => child.tagName === "TR");
  }

  deleteRow(index) {
    this.rows[index].remove();
  }

  /** Every element below this one, depth first. */
  descendants() {
    return this.children.flatMap((child) => [child, ...child.descendants()]);
  }
}

/** Install `document` and `requestAnimationFrame` on globalThis (idempotent). */
export function installFakeDom() {
  if (globalThis.document?.fake) return globalThis.document;
  globalThis.document = {
    fake: true,
    createElement: (tag) => new FakeElement(tag),
    createTextNode: (data) => new FakeText(data),
    getElementById: () => null,
    querySelector: () => null,
    addEventListener() {},
    removeEventListener() {},
    visibilityState: "visible",
    cookie: "",
  };
  globalThis.requestAnimationFrame ??= () => 1; // never fires: scrolling is not under test
  return globalThis.document;
}

export function element(tag = "div") {
  return new FakeElement(tag);
}
