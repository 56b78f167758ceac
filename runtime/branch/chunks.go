package branch

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Chunking. Page images are cut at page boundaries chosen by the pages'
// contents, so a page inserted or removed early in an image moves the cut
// points after it with the data instead of changing every chunk: two
// branches of a workspace share every chunk its change did not touch.
const (
	pageSize = 4096
	// A cut may come after minPages, must come at maxPages; in between
	// it comes after a page whose tail hashes to zero under cutMask, so
	// chunks average about minPages + cutMask + 1 pages (320 KiB).
	minPages = 16
	maxPages = 256
	cutMask  = 63
)

// Chunk is one piece of a file, stored once under its SHA-256.
type Chunk struct {
	Hash string `json:"sha256"`
	Size int64  `json:"size"`
}

// cutAfter reports whether a chunk may end after page p: a hash of its last
// 64 bytes. Zero pages cut too (their hash is 0), so a run of them becomes
// identical minimum-size chunks, each stored once.
func cutAfter(p []byte) bool {
	tail := p[len(p)-64:]
	var h uint64
	for i := 0; i < 64; i += 8 {
		h = (h ^ binary.LittleEndian.Uint64(tail[i:])) * 0x9e3779b97f4a7c15
	}
	return (h>>40)&cutMask == 0
}

// cuts splits data into chunk lengths.
func cuts(data []byte) []int {
	var out []int
	start := 0
	for start < len(data) {
		end := start
		for pages := 1; ; pages++ {
			next := end + pageSize
			if next >= len(data) {
				end = len(data)
				break
			}
			end = next
			if pages >= maxPages || (pages >= minPages && cutAfter(data[end-pageSize:end])) {
				break
			}
		}
		out = append(out, end-start)
		start = end
	}
	return out
}

// chunkStore holds zstd-compressed chunks under <dir>/<first two hex>/<hash>.
type chunkStore struct{ dir string }

func (c chunkStore) path(hash string) string {
	return filepath.Join(c.dir, hash[:2], hash)
}

var (
	encoderOnce sync.Once
	encoder     *zstd.Encoder
	decoderOnce sync.Once
	decoder     *zstd.Decoder
)

// Both are safe for concurrent EncodeAll/DecodeAll.
func zstdEncoder() *zstd.Encoder {
	encoderOnce.Do(func() {
		encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	})
	return encoder
}

// boundedDecoder decodes chunks: no chunk is bigger than maxChunkBytes, so
// neither is what it decodes, whatever a chunk's frame header claims.
func boundedDecoder() *zstd.Decoder {
	decoderOnce.Do(func() {
		decoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxChunkBytes))
	})
	return decoder
}

// oNoFollow refuses to open a symlink: a branch's own files never are.
const oNoFollow = unix.O_NOFOLLOW

// newFile opens a file of the branch to write it (copyfile): one that must
// not exist yet.
const newFile = os.O_EXCL | oNoFollow

// put stores data unless a chunk with its hash is there already. It
// returns the bytes it added to the disk (0 for a chunk shared with
// another branch, or another file of this one).
func (c chunkStore) put(hash string, data []byte) (int64, error) {
	final := c.path(hash)
	if _, err := os.Stat(final); err == nil {
		return 0, nil
	}
	return c.write(hash, zstdEncoder().EncodeAll(data, nil))
}

// write stores chunk hash, compressed as packed, under its final name.
func (c chunkStore) write(hash string, packed []byte) (int64, error) {
	final := c.path(hash)
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(final), ".tmp-"+hash[:8]+"-*")
	if err != nil {
		return 0, err
	}
	_, err = f.Write(packed)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), final)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, fmt.Errorf("storing chunk %s: %w", hash, err)
	}
	return int64(len(packed)), nil
}

// ErrCorrupt marks a chunk whose contents do not match its hash, or that is
// missing.
var ErrCorrupt = errors.New("branch data is corrupt")

// get reads chunk ch back and checks it against its hash.
func (c chunkStore) get(ch Chunk) ([]byte, error) {
	if !hashRE.MatchString(ch.Hash) || ch.Size <= 0 || ch.Size > maxChunkBytes {
		return nil, invalid("chunk %.80q of %d bytes", ch.Hash, ch.Size)
	}
	packed, err := os.ReadFile(c.path(ch.Hash))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: chunk %s is missing from %s", ErrCorrupt, ch.Hash, c.dir)
	}
	if err != nil {
		return nil, err
	}
	data, err := boundedDecoder().DecodeAll(packed, make([]byte, 0, ch.Size))
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %s does not decompress: %v", ErrCorrupt, c.path(ch.Hash), err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != ch.Hash || int64(len(data)) != ch.Size {
		return nil, fmt.Errorf("%w: chunk %s holds data with hash %s (%d bytes, want %d)", ErrCorrupt, c.path(ch.Hash), got, len(data), ch.Size)
	}
	return data, nil
}

// storedSize is the size of chunk hash on disk, 0 when it is missing.
func (c chunkStore) storedSize(hash string) int64 {
	if !hashRE.MatchString(hash) {
		return 0
	}
	st, err := os.Stat(c.path(hash))
	if err != nil {
		return 0
	}
	return st.Size()
}

// putFile chunks the file at path into the store. It returns its chunks
// and the bytes it added to the disk.
func (c chunkStore) putFile(path string) ([]Chunk, int64, error) {
	data, err := mapFile(path)
	if err != nil {
		return nil, 0, err
	}
	defer unmap(data)
	lens := cuts(data)
	offsets := make([]int, len(lens)+1)
	for i, l := range lens {
		offsets[i+1] = offsets[i] + l
	}
	piece := func(i int) []byte { return data[offsets[i]:offsets[i+1]] }
	chunks := make([]Chunk, len(lens))
	parallel(len(lens), func(i int) error {
		sum := sha256.Sum256(piece(i))
		chunks[i] = Chunk{Hash: hex.EncodeToString(sum[:]), Size: int64(lens[i])}
		return nil
	})
	// Each distinct chunk is stored once, by the first piece that has it.
	var unique []int
	seen := map[string]bool{}
	for i, ch := range chunks {
		if !seen[ch.Hash] {
			seen[ch.Hash] = true
			unique = append(unique, i)
		}
	}
	added := make([]int64, len(unique))
	err = parallel(len(unique), func(k int) error {
		var err error
		added[k], err = c.put(chunks[unique[k]].Hash, piece(unique[k]))
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("storing %s: %w", path, err)
	}
	var total int64
	for _, a := range added {
		total += a
	}
	return chunks, total, nil
}

// getFile writes the file at path, which must not exist, from its chunks,
// checking each.
func (c chunkStore) getFile(path string, mode os.FileMode, chunks []Chunk) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, mode.Perm())
	if err != nil {
		return err
	}
	offsets := make([]int64, len(chunks))
	var size int64
	for i, ch := range chunks {
		offsets[i] = size
		size += ch.Size
	}
	err = f.Truncate(size)
	if err == nil {
		err = parallel(len(chunks), func(i int) error {
			data, err := c.get(chunks[i])
			if err != nil {
				return err
			}
			_, err = f.WriteAt(data, offsets[i])
			return err
		})
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// mapFile maps a file read-only; an empty file is an empty slice.
func mapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	return data, nil
}

func unmap(data []byte) {
	if data != nil {
		unix.Munmap(data)
	}
}

// parallel runs fn(0..n-1) on one worker per CPU and returns the first
// error; after one, the workers take no new index.
func parallel(n int, fn func(i int) error) error {
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= n {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for w := 0; w < min(n, runtime.NumCPU()); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, ok := take()
				if !ok {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}
