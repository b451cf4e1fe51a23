/**
 * lookup.js — reading the page's tables of words and classes by a name from outside.
 *
 * The modules keep small object literals (`REASONS`, `SIGNAL_CLASSES`, `SENTENCES`, …)
 * read by an event type, a code or a reason that came from the wire. `table[key]` would
 * also find what every object inherits: `toString`, `constructor`, `__proto__`,
 * `hasOwnProperty`, `valueOf`… — a function or Object.prototype where a string was
 * expected (a class name with spaces throws in `classList.add`; a publisher could break the
 * page of every viewer with one event). `lookup(table, key)` finds own properties only;
 * every such read in static/qwenweb/ goes through it (tests/js/prototype_keys.test.mjs).
 *
 * No DOM, no dependency.
 */

/** `table[key]` when `key` is one of `table`'s own properties, else undefined. */
export function lookup(table, key) {
  return Object.hasOwn(table, key) ? table[key] : undefined;
}
