/**
 * api_error.js — the one reader of the server's JSON error envelope in the browser.
 *
 * Every refusal of the API and of the stream route carries `{"error": <words>, "code":
 * <machine code>, ...}` (docs/protocol.md, "Errors and limits"; `sessions/errors.py`).
 * These helpers read its two fields; each caller decides what to show. Pure, no DOM;
 * they run under Node 20.
 */

/**
 * The envelope's `{code, error}` from a parsed body: each a string, or undefined when the
 * body is not an object or the field is not a string. Never throws.
 */
export function envelopeFields(body) {
  if (body === null || typeof body !== "object" || Array.isArray(body)) return { code: undefined, error: undefined };
  return {
    code: typeof body.code === "string" ? body.code : undefined,
    error: typeof body.error === "string" ? body.error : undefined,
  };
}

/** Read `response`'s body as the envelope: `{code, error}` as above (both undefined when the body is not JSON). Consumes the body; never throws. */
export async function readErrorEnvelope(response) {
  try {
    return envelopeFields(JSON.parse(await response.text()));
  } catch {
    // not JSON, or the body failed: the status alone must explain
    return { code: undefined, error: undefined };
  }
}
