//! The member link's side of start-up: its TLS from the control
//! identities, its peers, its listener (bound, or taken over).

use std::sync::Arc;

use tokio::net::TcpListener;

use super::error::StartError;
use super::listeners::bind;
use crate::member_link::link::Link;

/// The member link, ready to accept once the data plane runs.
#[derive(Debug)]
pub(super) struct PairSetup {
    pub(super) listener: Arc<TcpListener>,
    pub(super) link: Arc<Link>,
}

/// Build the link from `[pair]` and `[control]`'s identity files (checked
/// by config validation: `[pair]` needs `[control]`).
pub(super) async fn setup_pair(
    config: &crate::config::Config,
    adopted: Option<TcpListener>,
) -> Result<Option<PairSetup>, StartError> {
    let (Some(p), Some(c)) = (&config.pair, &config.control) else {
        return Ok(None);
    };
    let ca = crate::config::read_pem_certs(c.ca_file.get_ref()).map_err(StartError::Control)?;
    let chain =
        crate::config::read_pem_certs(c.cert_file.get_ref()).map_err(StartError::Control)?;
    let key = crate::config::read_private_key(c.key_file.get_ref()).map_err(StartError::Control)?;
    let server = crate::tls::link_server_config(&ca, chain.clone(), key.clone_key())
        .map_err(StartError::ControlTls)?;
    let client =
        crate::tls::link_client_config(&ca, chain.clone(), key.clone_key(), crate::tls::LINK_ALPN)
            .map_err(StartError::ControlTls)?;
    let asking = crate::tls::link_client_config(&ca, chain, key, crate::tls::HOLDINGS_ALPN)
        .map_err(StartError::ControlTls)?;
    let peers = p
        .peers
        .iter()
        .map(|peer| (Arc::from(peer.id.get_ref().as_str()), *peer.link.get_ref()))
        .collect();
    let listener = match adopted {
        Some(l) => l,
        None => bind("pair", *p.listen.get_ref()).await?,
    };
    Ok(Some(PairSetup {
        listener: Arc::new(listener),
        link: Arc::new(Link::new(
            crate::member_link::link::Tls {
                server,
                client,
                asking,
            },
            peers,
            *p.max_forwarded_per_session.get_ref(),
            std::time::Duration::from_millis(*p.holdings_interval_ms.get_ref()),
        )),
    }))
}
