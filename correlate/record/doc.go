// Package record is gaptrace's recording and replay format: the engine's
// whole input, call by call, as gzip-compressed JSON lines. One header
// line holds the configuration (Header), then one line per Event, Window,
// Advance, SetDevice, SetRank, Peer, PeerLeft, ProbesLive and the final
// Close (Call), in the order the sidecar made them. Replaying it through a
// fresh Engine gives exactly the gaps, steps and summary of the run (the
// engine is deterministic in its input), so a user's recording reproduces
// a mis-attribution offline, and the golden replay tests use the same
// format.
//
// # Lifecycle
//
// The sidecar wraps the engine's input (Wrap) around a Writer: every call
// is written before it is passed on, and Close flushes the file. Replay
// reads it back a call at a time (Reader, in memory bounded by MaxLine),
// checks each call (Check: one call per line, fields within what a
// sidecar records) and feeds a fresh Engine (Replay, ReplaySeq); ReplayAs
// shows a full recording as lite or auto would have seen the same run.
//
// # Rule
//
// This package sits above the engine: it imports correlate (the Input it
// wraps, the Engine it replays into) and event, and the engine knows
// nothing of recordings. It owns the format and its checks; it decides
// nothing about gaps or steps.
//
// # Files
//
//	record.go    Call and Header (the format), Writer, Reader, Read, Check
//	replay.go    Replay, ReplaySeq and Wrap: feeding an Input from calls,
//	             and recording the calls made on one
//	replayas.go  View, CheckView, ReplayAs: a full recording replayed as
//	             lite or auto would have seen it
package record
