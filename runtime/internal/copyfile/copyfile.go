// Package copyfile copies small files whole: CRIU's logs, statistics and
// inventory out of a plan, a branch's checkpoint archive into it.
package copyfile

import (
	"fmt"
	"io"
	"os"
)

// Copy copies the file src to dst, which it opens as From does.
func Copy(src, dst string, flag int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return From(in, dst, flag)
}

// From writes what r reads to dst, a file of mode 0600 opened for writing
// with os.O_CREATE and flag: os.O_TRUNC to replace a file there,
// os.O_EXCL to refuse one.
func From(r io.Reader, dst string, flag int) error {
	if flag&(os.O_TRUNC|os.O_EXCL) == 0 {
		// A longer file there would keep its old tail.
		return fmt.Errorf("copying to %s: say whether a file there is replaced (os.O_TRUNC) or refused (os.O_EXCL)", dst)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|flag, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
