/**
 * session_list.js — the "New session" button of `/sessions/`.
 *
 * Posts `{title}` to `POST /session` with the login session and the CSRF header (the API
 * checks both, `sessions.web.views.create_session`), then opens the new session's page. Errors
 * are shown next to the button as text.
 */
const form = document.getElementById("new-session");
const errorOutput = document.getElementById("new-session-error");

function csrfToken() {
  const input = form.querySelector("input[name=csrfmiddlewaretoken]");
  return input ? input.value : "";
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  errorOutput.textContent = "";
  try {
    const response = await fetch(form.dataset.createUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ title: form.elements.title.value.trim() }),
    });
    const body = await response.json().catch(() => ({}));
    if (response.status !== 201) {
      errorOutput.textContent = `Could not create the session: HTTP ${response.status} ${body.error ?? ""}`;
      return;
    }
    window.location.assign(form.dataset.pageUrl.replace(form.dataset.idPlaceholder, body.id));
  } catch (error) {
    errorOutput.textContent = `Could not create the session: ${error}`;
  } finally {
    button.disabled = false;
  }
});
