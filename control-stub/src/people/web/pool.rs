//! The web app's own store connections: a few, each taken by one request
//! at a time, its synchronous transactions on a blocking thread.

use std::sync::{Arc, Mutex};

use talos_contract::sync::Locked;
use tokio::sync::Semaphore;

use crate::error::Error;
use crate::store::{Db, Store};

/// A few store connections of the app's own, each taken by one request at
/// a time.
pub(crate) struct Pool {
    stores: Mutex<Vec<Store>>,
    free: Semaphore,
}

impl Pool {
    pub(crate) fn open(db: &Db, n: usize) -> Result<Pool, Error> {
        let stores = (0..n)
            .map(|_| Store::open(db))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pool {
            stores: Mutex::new(stores),
            free: Semaphore::new(n),
        })
    }

    /// Run `f` with a store connection on a blocking thread (the store's
    /// transactions are synchronous).
    pub(crate) async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let _permit = self
            .free
            .acquire()
            .await
            .map_err(|_| Error::Store("the web app's store connections are closed".into()))?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut store = pool
                .stores
                .locked()
                .pop()
                .ok_or_else(|| Error::Store("no free store connection".into()))?;
            let out = f(&mut store);
            pool.stores.locked().push(store);
            out
        })
        .await
        .map_err(|e| Error::Store(format!("web app task: {e}")))?
    }
}
