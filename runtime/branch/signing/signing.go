// Package signing signs exported branches and says whom an import trusts.
//
// Each host has one ed25519 key, made on its first export and kept
// root-only (plan.Layout.Keys): the private key in
// host.key (0600), its public half in host.pub, in a directory of mode
// 0700. A public key is written as one line, "tclone-ed25519 BASE64", which
// is what `podman container branch key` prints and what --trust takes.
//
// An import trusts the host's own key, the keys given with --trust, and the
// keys in the trusted-keys directory (plan.Layout.TrustedKeys): one *.pub file a key. That directory and its
// files must belong to root and be writable by no one else, or none of them
// is trusted (as sshd treats an authorized_keys file others can write).
package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// KeyPrefix begins every public key as tclone writes it.
const KeyPrefix = "tclone-ed25519 "

// PublicKey is an ed25519 public key.
type PublicKey ed25519.PublicKey

// String is the key as tclone writes it: "tclone-ed25519 BASE64".
func (k PublicKey) String() string { return KeyPrefix + base64.StdEncoding.EncodeToString(k) }

// Fingerprint names the key briefly: SHA256: and the first 16 hex digits
// of its hash.
func (k PublicKey) Fingerprint() string {
	sum := sha256.Sum256(k)
	return "SHA256:" + hex.EncodeToString(sum[:8])
}

// ParsePublicKey reads a key as String writes it; the prefix may be left
// out, and surrounding space is ignored.
func ParsePublicKey(text string) (PublicKey, error) {
	t := strings.TrimSpace(text)
	t = strings.TrimSpace(strings.TrimPrefix(t, strings.TrimSpace(KeyPrefix)))
	raw, err := base64.StdEncoding.DecodeString(t)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%q is not a tclone public key: give it as `podman container branch key` prints it (%sBASE64, %d bytes)", abbreviate(text), KeyPrefix, ed25519.PublicKeySize)
	}
	return PublicKey(raw), nil
}

// ParseTrust reads a --trust value: a key, or a file holding one.
func ParseTrust(value string) (PublicKey, error) {
	if k, err := ParsePublicKey(value); err == nil {
		return k, nil
	}
	data, err := os.ReadFile(value)
	if err != nil {
		return nil, fmt.Errorf("--trust %s: neither a public key nor a readable file holding one: %w", abbreviate(value), err)
	}
	k, err := ParsePublicKey(string(data))
	if err != nil {
		return nil, fmt.Errorf("--trust %s: %w", value, err)
	}
	return k, nil
}

func abbreviate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// Key is a host's signing key.
type Key struct{ private ed25519.PrivateKey }

// Public is the key's public half.
func (k *Key) Public() PublicKey { return PublicKey(k.private.Public().(ed25519.PublicKey)) }

// Sign signs msg.
func (k *Key) Sign(msg []byte) []byte { return ed25519.Sign(k.private, msg) }

// HostKey loads the host's key from dir, making it on first use. The
// directory is made 0700 and the key file 0600, both root's; a key file
// anyone else could read or change is refused.
func HostKey(dir string) (*Key, error) {
	if k, err := loadKey(dir); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the signing key directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	_, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the host's signing key: %w", err)
	}
	k := &Key{private: private}
	// Written under a temporary name and linked into place, so that two
	// first exports at once agree on one key: the second's link fails and
	// it loads the first's.
	tmp, err := os.CreateTemp(dir, ".host.key-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(base64.StdEncoding.EncodeToString(private.Seed()) + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing the host's signing key: %w", err)
	}
	if err := os.Link(tmp.Name(), filepath.Join(dir, "host.key")); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("storing the host's signing key: %w", err)
	}
	k, err = loadKey(dir)
	if err != nil {
		return nil, err
	}
	pub := k.Public().String() + "\n"
	if err := os.WriteFile(filepath.Join(dir, "host.pub"), []byte(pub), 0o644); err != nil {
		return nil, fmt.Errorf("writing the host's public key: %w", err)
	}
	return k, nil
}

func loadKey(dir string) (*Key, error) {
	path := filepath.Join(dir, "host.key")
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := ownedByRootOnly(f, 0o077); err != nil {
		return nil, fmt.Errorf("the host's signing key %s: %w", path, err)
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(buf[:n])))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s does not hold an ed25519 key: remove it to make a new one (archives signed with it are then no longer known by its public key)", path)
	}
	return &Key{private: ed25519.NewKeyFromSeed(seed)}, nil
}

// ownedByRootOnly refuses a file not owned by root, or with any of the
// mode bits in forbidden.
func ownedByRootOnly(f *os.File, forbidden os.FileMode) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Uid != 0 {
		return fmt.Errorf("owned by uid %d, not root", sys.Uid)
	}
	if st.Mode().Perm()&forbidden != 0 {
		return fmt.Errorf("mode %v lets others than root %s it", st.Mode().Perm(), map[bool]string{true: "change", false: "read"}[forbidden == 0o022])
	}
	return nil
}

// Trust is the set of keys an import accepts.
type Trust struct {
	keys map[string]PublicKey // by String()
	// Sources says where the keys came from, for an error that lists them.
	Sources []string
	// Dir is the trusted-keys directory read, if any.
	Dir string
}

// Add trusts k, which came from where.
func (t *Trust) Add(k PublicKey, where string) {
	if t.keys == nil {
		t.keys = map[string]PublicKey{}
	}
	if _, ok := t.keys[k.String()]; !ok {
		t.Sources = append(t.Sources, fmt.Sprintf("%s (%s)", k.Fingerprint(), where))
	}
	t.keys[k.String()] = k
}

// Trusts reports whether k is trusted.
func (t *Trust) Trusts(k PublicKey) bool {
	_, ok := t.keys[k.String()]
	return ok
}

// HostTrust is what a host trusts by default: its own key, if it has one
// yet, and the keys of the trusted-keys directory dir (when it exists).
func HostTrust(keyDir, dir string) (*Trust, error) {
	t := &Trust{}
	k, err := loadKey(keyDir)
	switch {
	case err == nil:
		t.Add(k.Public(), "this host's key")
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	if err := t.addDir(dir); err != nil {
		return nil, err
	}
	t.Dir = dir
	return t, nil
}

func (t *Trust) addDir(dir string) error {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the trusted keys in %s: %w", dir, err)
	}
	defer d.Close()
	if err := ownedByRootOnly(d, 0o022); err != nil {
		return fmt.Errorf("the trusted keys directory %s: %w; none of its keys is trusted until only root can change it", dir, err)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasSuffix(name, ".pub") {
			continue
		}
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("trusted key %s: %w", path, err)
		}
		err = ownedByRootOnly(f, 0o022)
		var k PublicKey
		if err == nil {
			buf := make([]byte, 1024)
			n, rerr := f.Read(buf)
			if rerr != nil {
				err = rerr
			} else {
				k, err = ParsePublicKey(string(buf[:n]))
			}
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("trusted key %s: %w", path, err)
		}
		t.Add(k, path)
	}
	return nil
}

// Verify reports whether sig is k's signature of msg.
func (k PublicKey) Verify(msg, sig []byte) bool {
	return len(sig) == ed25519.SignatureSize && ed25519.Verify(ed25519.PublicKey(k), msg, sig)
}
