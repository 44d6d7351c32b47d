// The board's clicks and drags are handled once, on the board, by the Datastar expressions
// in views.py and these helpers: a card's HTML carries data (ids, a button's name and value),
// not behaviour, which keeps a 200-card board small. The helpers read the page; the
// expressions own the signals and send the commands.
const kanban = {
  // The card or lane button clicked: {name, card, lane, position, title, description}, or null.
  action(evt) {
    const button = evt.target.closest("button[name]");
    if (!button) return null;
    const card = button.closest(".card");
    const lane = button.closest(".lane");
    const [toLane, where] = (button.value || ",").split(",");
    // The card's place is read from the page, so its cached HTML need not carry it.
    const index = card ? [...card.parentElement.children].indexOf(card) : 0;
    const position = where === "up" ? Math.max(0, index - 1) : where === "down" ? index + 1 : index;
    return {
      name: button.name,
      card: card ? Number(card.id.slice(5)) : 0,
      lane: Number(toLane) || Number(lane.id.slice(5)),
      position,
      title: (card || lane).querySelector(card ? ".card-title" : ".lane-title").textContent,
      description: card?.querySelector(".card-desc")?.textContent ?? "",
    };
  },
  // A drag starts on a card: its id (0 for anything else).
  dragged(evt) {
    const card = evt.target.closest?.(".card");
    if (!card) return 0;
    evt.dataTransfer.effectAllowed = "move";
    evt.dataTransfer.setData("text/plain", card.id);
    return Number(card.id.slice(5));
  },
  // A card is dragged over a lane: accept the drop there and highlight the lane.
  over(evt) {
    const list = evt.target.closest(".cards");
    if (!list) return;
    evt.preventDefault();
    evt.dataTransfer.dropEffect = "move";
    list.classList.add("drag-over");
  },
  leave(evt) {
    const list = evt.target.closest(".cards");
    if (list && !list.contains(evt.relatedTarget)) list.classList.remove("drag-over");
  },
  // Where a dropped card lands: the place of the card it was dropped on, else the lane's end.
  drop(evt) {
    const list = evt.target.closest(".cards");
    if (!list) return null;
    evt.preventDefault();
    list.classList.remove("drag-over");
    const cards = [...list.querySelectorAll(".card")];
    const index = cards.indexOf(evt.target.closest(".card"));
    return { lane: Number(list.closest(".lane").id.slice(5)), position: index < 0 ? cards.length : index };
  },
  clear() {
    document.querySelectorAll(".drag-over").forEach((list) => list.classList.remove("drag-over"));
  },
  focus(id) {
    setTimeout(() => document.getElementById(id)?.focus()); // once data-show has shown its form
  },
};
