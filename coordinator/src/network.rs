//! Raft RPC over HTTP/1 with JSON bodies: one keep-alive connection per peer, reopened when it
//! breaks, every call bounded by the deadline raft gives it (`RPCOption::hard_ttl`). Transport
//! failures are classified for raft: refused or unresolvable → `Unreachable` (raft backs off),
//! anything else in transit → `Network`, an error the peer returned → `RemoteError`. Every RPC
//! presents the cluster token; a peer that refuses it (401) is a `Network` error, so raft keeps
//! retrying while an operator fixes the token.

use bytes::Bytes;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use protocol::connection::{Connection, TransportError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::TypeConfig;

/// Makes a [`Peer`] per raft target.
pub struct Network {
    /// The cluster token every RPC presents: members refuse raft RPCs without it.
    pub token: protocol::Secret,
    /// This member's mutual TLS, when the group runs it.
    pub tls: Option<protocol::tls::Tls>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer { target, connection: Connection::new(node.addr.clone(), self.token.clone()).with_tls(self.tls.clone()) }
    }
}

/// The raft RPC client for one peer.
pub struct Peer {
    target: u64,
    connection: Connection,
}

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = serde_json::to_vec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let (status, body) =
            self.connection.post(path, Bytes::from(body), option.hard_ttl()).await.map_err(|e| match e {
                TransportError::Unreachable(..) => RPCError::Unreachable(Unreachable::new(&e)),
                TransportError::Network(..) => RPCError::Network(NetworkError::new(&e)),
            })?;
        if status != hyper::StatusCode::OK {
            let refused = std::io::Error::other(format!("member {} answered {status} to {path}", self.target));
            if status == hyper::StatusCode::UNAUTHORIZED {
                tracing::warn!(target = self.target, "a peer refused this member's cluster token");
            }
            return Err(RPCError::Network(NetworkError::new(&refused)));
        }
        let answer: Result<Resp, E> =
            serde_json::from_slice(&body).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call("/raft/append", &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        self.call("/raft/snapshot", &request, &option).await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call("/raft/vote", &request, &option).await
    }
}
