module github.com/tclone/tclone/test/bench

go 1.26.0

require (
	github.com/checkpoint-restore/go-criu/v7 v7.2.0
	github.com/tclone/tclone v0.0.0-00010101000000-000000000000
	golang.org/x/sys v0.50.0
	gonum.org/v1/plot v0.17.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/go-cmp v0.6.0 // indirect
	github.com/klauspost/compress v1.17.11 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.28.0 // indirect
	google.golang.org/protobuf v1.36.3 // indirect
)

// The harness imports the product's packages (runtime/plan,
// test/inheritfd) from this checkout.
replace github.com/tclone/tclone => ../..
