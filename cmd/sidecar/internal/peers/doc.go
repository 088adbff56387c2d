// Package peers carries correlate.PeerRecord values between the sidecars
// that trace the ranks of one distributed training job, so that each
// engine sees the communicators of the ranks traced elsewhere.
//
// # Roles
//
// The sidecars of a job share one address (--peers host:port). Each tries
// to listen on it: the one that can is the hub, the others dial it as
// members. A sidecar that cannot reach the hub, or loses it, tries to
// listen again before each retry, so when the hub's sidecar exits one on
// the same host takes its place and the others join it. Retries back off
// from 100 ms to 2 s; a sidecar the hub refuses retries every 5 s.
//
// # Wire protocol
//
// A connection carries newline-delimited messages, each a JSON object with
// a type "t". The sidecars of a job share a secret K (--peers-secret-file,
// at least 32 bytes; auth.go). A member first sends auth {v, n}: the
// protocol version and a fresh 32-byte nonce Nm. The hub answers
// challenge {n, mac}: its own fresh nonce Nh and HMAC-SHA256(K, "hub",
// job, Nm, Nh), or error {err} and closes for another protocol version
// (nothing else is ever answered before the member proved K). A member
// that finds the proof wrong (another job, another secret, another program
// on the port) leaves without another word and retries every 5 s. From
// then on every message each way is sealed with AES-256-GCM under a key
// drawn from K, the job and both nonces, one per direction, its GCM nonce
// the message's number, and base64-encoded: a message that does not open
// (no K, a replayed or reordered message) drops the connection unanswered.
// The member then sends 8 pings {t1} that the hub answers with pongs {t1,
// t2}, then hello {id, mac} with HMAC-SHA256(K, "member", job, Nh, Nm,
// id). The hub answers welcome {id, peers} (its own ID, the other
// members), or error {err} and closes: an ID already in the exchange, the
// exchange full (1,024 members). A hello under the ID of a member not
// heard from for two pings replaces that member: the same sidecar back on
// a new connection, its old one broken on its side and not yet timed out
// at the hub. After that either side sends recs {from, recs}; the member
// pings every 5 s; the hub sends joined {id} and left {id} as members come
// and go.
//
// Every message is checked as it is decoded (wire.go): IDs at most 256
// bytes, at most 1,024 members and 512 records a message, clock readings
// and every record within range (correlate.PeerRecord.Check). A batch
// with a bad record, or past a member's rate (20,000 records a second,
// bursts of a full snapshot), is dropped and counted in Stats.Rejected; a
// member keeps at most 1,024 others in its list. A line over 1 KiB before
// the proof or 1 MiB after it, a message that does not parse, no proof
// within 3 s of connecting, no hello within 10 s of the proof, or 30 s
// without a message drops the connection. The hub holds at most 64
// connections that have not proved K yet (a new one closes the oldest),
// so idle or slow sockets never keep a member out.
//
// # Clocks
//
// Records carry Unix nanoseconds of the host that made them. A member
// estimates offset = hub clock − own clock from each ping, as t2 −
// (t1+t3)/2 with t3 when the pong arrived, and keeps the sample with the
// shortest round trip of the last 8. It shifts the records it sends by
// +offset, into the hub's clock, and those it receives by −offset; the
// hub's own are in its clock already. So every Batch is in the clock of
// the sidecar that receives it.
//
// # Relaying and snapshots
//
// The hub forwards each member's records to every other member, stamped
// with the sender's ID, and delivers them to its own Recv; its own records
// go to every member. Each sidecar remembers the PeerComm records it sent,
// one per (PID, Comm), less those of processes it reported gone
// (PeerGone). A member re-sends them whenever it connects and when the hub
// says another member joined; the hub sends its own to each member that
// joins. A sidecar that joins late thus learns every communicator that
// exists; receivers drop what they already hold. Process states
// (PeerProc) are not kept here: their sender tells them all again every
// 5 s.
//
// A sidecar that goes is reported on Recv as a Batch with Left set: on the
// hub when the member's connection ends, on the members when the hub says
// left {id}, and, when a member loses its hub, for the hub and every
// member it relayed (they send their communicators again once it or its
// successor relays them).
//
// # Flow
//
// Send never blocks: records wait in a queue of 8192 and leave in messages
// of up to 512, at most 20 ms after they were queued. What does not fit —
// a full queue, a Recv consumer behind by 256 batches, a member's
// connection backed up at the hub — is dropped and counted in
// Stats.Dropped; the engine treats a collective it never heard of as
// unknown.
package peers
