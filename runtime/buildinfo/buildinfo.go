// Package buildinfo holds the version stamped into tclone at build time.
package buildinfo

// Version is set by the Makefile through -ldflags -X.
var Version = "dev"
