// The good page: says it is ready, greets whoever submits the form, and
// notes how the button was pressed (a mouse or a finger).
"use strict";
document.getElementById("status").textContent = "Ready";
document.getElementById("greet").addEventListener("pointerdown", (e) => {
  document.body.dataset.pointer = e.pointerType;
});
document.getElementById("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const name = document.getElementById("name").value;
  document.getElementById("greeting").textContent = `Hello, ${name}`;
});
