// The answers people ask for, on a card: Respond (answer the model with a message instead of
// running the call; docs/answers.md). Kept apart from ./pending so the card only hooks it in:
// a button that opens a text box, and what a decided card says of a response. A response is
// never sent empty: the broker would refuse it naming `response`, and the page says so first.
import { h } from "./dom";
import type { Outcome } from "./gen/approvals/v1/types_pb";

/** The Respond button and its form for the card of `label`; `send` decides the call. */
export function respondControls(label: string, send: (message: string) => void): { button: HTMLElement; form: HTMLFormElement } {
  const message = h("textarea", {
    name: "response",
    rows: "3",
    "aria-label": `Message to the model instead of running ${label}`,
    placeholder: "your answer to the model (the call is not run)",
  });
  const error = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "respond-form", hidden: true },
    h("p", { class: "meta" }, "The call is not run. The model reads your message as your words, in place of the tool's result."),
    message,
    error,
    h("button", { type: "submit", class: "respond" }, "Send response"),
    h("button", { type: "button", onClick: () => (form.hidden = true) }, "Cancel"),
  ) as HTMLFormElement;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (message.value.trim() === "") {
      error.textContent = "Not sent: write a message for the model (a response cannot be empty).";
      message.setAttribute("aria-invalid", "true");
      message.focus();
      return;
    }
    error.textContent = "";
    message.removeAttribute("aria-invalid");
    send(message.value);
  });
  const button = h(
    "button",
    {
      type: "button",
      class: "respond",
      "aria-label": `Respond to ${label} with a message instead of running it`,
      onClick: () => {
        form.hidden = false;
        message.focus();
      },
    },
    "Respond…",
  );
  return { button, form };
}

/** What a decided card says of its outcome, when a person answered instead of running it. */
export function responseNote(outcome: Outcome): string | undefined {
  return outcome.responded ? `answered the model: “${outcome.reason}”` : undefined;
}
