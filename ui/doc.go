// Package ui is kvtop's dashboard: a Bubble Tea program that draws one decode instance from a
// small source interface, which both an in-process engine subscription and the websocket
// client satisfy.
//
// # Imports
//
// ui imports engine (for its value types) and never wire or net.
package ui
