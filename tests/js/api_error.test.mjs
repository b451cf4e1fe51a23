// The one reader of the JSON error envelope (static/qwenweb/api_error.js).
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { envelopeFields, readErrorEnvelope } from "../../static/qwenweb/api_error.js";

describe("the JSON error envelope", () => {
  it("gives the code and the words of an envelope", async () => {
    const response = new Response(JSON.stringify({ error: "no such session", code: "not_found" }), { status: 404 });
    assert.deepEqual(await readErrorEnvelope(response), { code: "not_found", error: "no such session" });
  });

  it("gives nothing for a body that is not JSON, not an object, or fields that are not strings", async () => {
    const none = { code: undefined, error: undefined };
    assert.deepEqual(await readErrorEnvelope(new Response("<html>", { status: 502 })), none);
    assert.deepEqual(envelopeFields(null), none);
    assert.deepEqual(envelopeFields(["not_found"]), none);
    assert.deepEqual(envelopeFields({ code: 404, error: { text: "x" } }), none);
  });
});
