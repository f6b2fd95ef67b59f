// Package protocol is the stream protocol of `kvtop serve`: its Version and history, the
// frames a server sends (hello, snapshot, events, dropped, status, error), the messages a
// client sends, and their JSON encoding, events included (each written with its kind first
// and read back into the engine's value type).
//
// It is only the codec: no HTTP, no websocket, no Prometheus. The server and the client in
// package wire speak it over a websocket; package record writes and reads it a frame a line,
// and so depends on nothing of the server. The golden files in testdata/ hold the bytes of
// every frame and event: a change that alters them is a change of the protocol, and bumps
// Version.
//
// # Usage
//
//	var buf bytes.Buffer
//	err := protocol.EncodeFrame(&buf, &protocol.Frame{Type: protocol.FrameEvents, Seq: 2, Events: evs})
//	f, err := protocol.DecodeFrame(buf.Bytes()) // errors.Is(err, protocol.ErrViolation) for a bad frame
//
// A writer of many frames keeps one Encoder, whose scratch space is reused:
//
//	var enc protocol.Encoder
//	err := enc.Encode(&buf, f)
//
// # Concurrency
//
// The functions are safe for concurrent use; an Encoder is not.
//
// # Imports
//
// protocol imports engine and feed for the values it carries, and nothing that does I/O.
package protocol
