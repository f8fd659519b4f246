// Plants a console error and an uncaught exception (the inline script in
// problems.html plants the CSP violation).
"use strict";
console.error("planted console error");
document.getElementById("status").textContent = "Planted";
setTimeout(() => {
  throw new Error("planted uncaught exception");
}, 0);
