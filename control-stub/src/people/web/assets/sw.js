// TALOS service worker: Web Push only. A message says that a card waits
// and which ({"type":"card_waiting","card":"…"}), never what it asks: the
// notification says a card waits, and opens the cards page, where the
// person reads it after signing in. No fetch handler: nothing is cached.
'use strict';

self.addEventListener('push', (event) => {
  let card = null;
  try {
    const data = event.data ? event.data.json() : null;
    if (data && data.type === 'card_waiting' && typeof data.card === 'string') card = data.card;
  } catch (e) {
    card = null;
  }
  event.waitUntil(self.registration.showNotification('A card is waiting for you', {
    body: 'Open TALOS to read it and decide.',
    tag: card ? 'card-' + card.slice(0, 64) : 'card',
    icon: '/icon.svg',
    data: { url: '/cards' },
  }));
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  event.waitUntil(self.clients.matchAll({ type: 'window', includeUncontrolled: true }).then((windows) => {
    for (const w of windows) {
      if (new URL(w.url).pathname === '/cards' && 'focus' in w) return w.focus();
    }
    return self.clients.openWindow('/cards');
  }));
});
