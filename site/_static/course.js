// The course website on a small screen (tests/test_site.py checks it at 390 px):
// - a table wider than the column scrolls inside its own box and says so: the box sits in a
//   `div.scroll-cue` that, while more of the table lies to the right, gets the class "scrolls"
//   (a shaded right edge) and a "scroll sideways" note above it;
// - a figure shrunk to the column opens at full size when tapped (a link to the image file).
(() => {
  function scrollBox(table) {
    // the element that scrolls: the table itself (display: block) or the box around it
    for (let el = table; el && !el.classList.contains("bd-article"); el = el.parentElement) {
      const style = getComputedStyle(el);  // a display: table element never scrolls
      if (["auto", "scroll"].includes(style.overflowX) && style.display !== "table") return el;
    }
    const box = document.createElement("div");  // none: give the table a box of its own
    box.className = "pst-scrollable-table-container";
    table.parentNode.insertBefore(box, table);
    box.appendChild(table);
    return box;
  }

  function mark(cue) {
    const box = cue.firstElementChild;
    const more = box.scrollWidth > box.clientWidth + 1
      && box.scrollLeft + box.clientWidth < box.scrollWidth - 1;
    cue.classList.toggle("scrolls", more);
    cue.previousElementSibling.hidden = !(box.scrollWidth > box.clientWidth + 1);
  }

  function setUp() {
    document.querySelectorAll(".bd-article table").forEach(table => {
      const box = scrollBox(table);
      if (box.parentElement.classList.contains("scroll-cue")) return;
      const cue = document.createElement("div");
      cue.className = "scroll-cue";
      const note = document.createElement("p");
      note.className = "scroll-note";
      note.textContent = "scroll sideways for more →";
      box.parentNode.insertBefore(note, box);
      box.parentNode.insertBefore(cue, box);
      cue.appendChild(box);
      box.addEventListener("scroll", () => mark(cue), {passive: true});
      mark(cue);
    });
    document.querySelectorAll(".bd-article .cell_output img").forEach(img => {
      if (img.closest("a")) return;
      const link = document.createElement("a");
      link.href = img.getAttribute("src");
      link.className = "figure-full";
      link.title = "Open the figure at full size";
      img.parentNode.insertBefore(link, img);
      link.appendChild(img);
    });
  }

  const refresh = () => document.querySelectorAll(".bd-article .scroll-cue").forEach(mark);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setUp);
  } else {
    setUp();
  }
  window.addEventListener("load", refresh);
  window.addEventListener("resize", refresh);
})();
