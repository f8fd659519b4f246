// Registers a passkey and signs an assertion with the options the test
// put at /options.json, and posts each response (every binary field
// base64url without padding) to /report/registration or /report/assertion;
// a refusal is posted to /report/registration_error or
// /report/assertion_error with the DOMException's name.
"use strict";

const status = (text) => { document.getElementById("status").textContent = text; };

const b64u = (buf) => {
  const bytes = new Uint8Array(buf instanceof ArrayBuffer ? buf : buf.buffer);
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
};

const unb64u = (text) => {
  const s = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return Uint8Array.from(s, (c) => c.charCodeAt(0));
};

const post = (name, body) => fetch(`/report/${name}`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

const options = async () => (await fetch("/options.json", { cache: "no-store" })).json();

async function register() {
  status("Registering");
  try {
    const o = await options();
    const cred = await navigator.credentials.create({ publicKey: {
      rp: { id: o.rpId, name: o.rpName },
      user: { id: unb64u(o.userId), name: o.userName, displayName: o.userDisplayName },
      challenge: unb64u(o.registrationChallenge),
      pubKeyCredParams: [{ type: "public-key", alg: -7 }],
      authenticatorSelection: {
        authenticatorAttachment: "platform",
        residentKey: "required",
        requireResidentKey: true,
        userVerification: "required",
      },
      attestation: "none",
      timeout: o.timeoutMs,
    } });
    const r = cred.response;
    await post("registration", {
      id: cred.id,
      rawId: b64u(cred.rawId),
      type: cred.type,
      authenticatorAttachment: cred.authenticatorAttachment,
      clientDataJSON: b64u(r.clientDataJSON),
      attestationObject: b64u(r.attestationObject),
      authenticatorData: b64u(r.getAuthenticatorData()),
      publicKey: b64u(r.getPublicKey()),
      publicKeyAlgorithm: r.getPublicKeyAlgorithm(),
      transports: r.getTransports(),
    });
    status("Registered");
  } catch (e) {
    await post("registration_error", { name: e.name, message: e.message });
    status(`Registration refused: ${e.name}`);
  }
}

async function signIn() {
  status("Signing in");
  try {
    const o = await options();
    const cred = await navigator.credentials.get({ publicKey: {
      rpId: o.rpId,
      challenge: unb64u(o.assertionChallenge),
      allowCredentials: (o.allowCredentials || []).map((id) => ({ type: "public-key", id: unb64u(id) })),
      userVerification: "required",
      timeout: o.timeoutMs,
    } });
    const r = cred.response;
    await post("assertion", {
      id: cred.id,
      rawId: b64u(cred.rawId),
      type: cred.type,
      clientDataJSON: b64u(r.clientDataJSON),
      authenticatorData: b64u(r.authenticatorData),
      signature: b64u(r.signature),
      userHandle: r.userHandle ? b64u(r.userHandle) : null,
    });
    status("Signed in");
  } catch (e) {
    await post("assertion_error", { name: e.name, message: e.message });
    status(`Sign-in refused: ${e.name}`);
  }
}

document.getElementById("register").addEventListener("click", register);
document.getElementById("sign-in").addEventListener("click", signIn);
status("Ready");
