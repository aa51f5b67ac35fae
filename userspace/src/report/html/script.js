// Hovering anything that belongs to an episode (its timeline bar, table row,
// heatmap bands, session links) highlights all of them. The page works
// without this script; it only links the views.
(function () {
  "use strict";
  function mark(id, on) {
    document.querySelectorAll('[data-episode="' + id + '"]').forEach(function (el) {
      el.classList.toggle("hl", on);
    });
  }
  document.querySelectorAll("[data-episode]").forEach(function (el) {
    var id = el.getAttribute("data-episode");
    el.addEventListener("mouseenter", function () { mark(id, true); });
    el.addEventListener("mouseleave", function () { mark(id, false); });
  });
  document.body.setAttribute("data-ready", "1");
})();
