// Package wire carries a decode instance's snapshot and step events to dashboards: the
// versioned frames and their JSON encoding, the HTTP server of `kvtop serve` (MLC
// microserving API and the websocket stream), and the Go client the dashboard uses to attach.
//
// # Imports
//
// wire imports engine and below; it never imports ui.
package wire
