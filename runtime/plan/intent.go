package plan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/runtime/internal/atomicfile"
	"github.com/tclone/tclone/runtime/journal"
	"github.com/tclone/tclone/runtime/procfs"
)

// Intent asks that the next checkpoint of a container be a fork capture.
//
// Podman's checkpoint call carries no option through to the runtime that
// could say "this is a fork", and an ordinary `podman container checkpoint`
// must still produce a normal, portable checkpoint. So the fork client leaves
// a short-lived intent for the container before asking Podman to checkpoint
// it; tclone's checkpoint consumes it and captures a fork plan instead.
type Intent struct {
	Version     int    `json:"version"`
	ContainerID string `json:"container_id"`
	// Nonce tells this request's intent from a later one for the same
	// container.
	Nonce     string    `json:"nonce"`
	ExpiresAt time.Time `json:"expires_at"`
	// Fork is the fork asked for, normalized by the client.
	Fork forkopts.Fork `json:"fork"`
	// CallerPaused says that the caller of the checkpoint pauses the source
	// around it and resumes it after: containerd's CRI checkpoint does. A
	// paused source is refused otherwise. The caller's pause is this
	// fork's own (ClaimCallerPause), which tclone's pause verb does not
	// freeze: the capture holds the source for its instant, as it holds a
	// running one, and tclone freezes it again once the capture is done,
	// for what the caller does before its resume. A source paused before
	// the request (the caller then neither pauses nor resumes it) is
	// captured frozen and left so.
	CallerPaused bool `json:"caller_paused,omitempty"`
	// Client is the process that asked for the fork, by PID and start time
	// (WriteIntent records the caller). The plan's uses are held for it:
	// once it has died the plan is removed as soon as no restore holds a
	// use (plan.Uses.Client).
	Client journal.Owner `json:"client"`
}

// IntentTTL is how long an unconsumed intent stays valid.
const IntentTTL = 2 * time.Minute

func (s Store) intentPath(containerID string) string {
	return filepath.Join(s.IntentsDir(), containerID+".json")
}

// WriteIntent records an intent for its container, replacing an older one.
func (s Store) WriteIntent(in Intent) error {
	if in.ContainerID == "" {
		return errors.New("intent names no container")
	}
	if err := os.MkdirAll(s.IntentsDir(), 0o700); err != nil {
		return fmt.Errorf("creating intent directory: %w", err)
	}
	in.Version = FormatVersion
	if in.Client.Pid == 0 {
		in.Client = journal.Self()
	}
	if in.ExpiresAt.IsZero() {
		in.ExpiresAt = time.Now().Add(IntentTTL).UTC()
	}
	return atomicfile.WriteJSON(s.intentPath(in.ContainerID), in, 0o600)
}

// TakeIntent consumes the intent for containerID. It returns nil when there
// is none or it expired; only one caller can take a given intent.
func (s Store) TakeIntent(containerID string) (*Intent, error) {
	path := s.intentPath(containerID)
	taken := fmt.Sprintf("%s.taken%d", path, os.Getpid())
	if err := os.Rename(path, taken); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer os.Remove(taken)
	var in Intent
	if err := atomicfile.ReadJSON(taken, &in); err != nil {
		return nil, fmt.Errorf("reading the fork intent for %s: %w", containerID, err)
	}
	if in.ContainerID != containerID || time.Now().After(in.ExpiresAt) {
		return nil, nil
	}
	return &in, nil
}

// ClaimCallerPause takes, for the caller of a fork's checkpoint that pauses
// the source around it (Intent.CallerPaused: containerd's CRI checkpoint),
// the one pause of the container's intent: it reports true once per intent,
// for its first pause. That pause needs no freeze: the fork's capture holds
// the source itself, and once it is done freezes it again for what the
// caller does before its resume (it archives the container's filesystem),
// so that the source is never held for both at once, as the caller's pause
// would hold it. Any other pause, or one with no such intent, is an
// ordinary one.
func (s Store) ClaimCallerPause(containerID string) (bool, error) {
	var in Intent
	err := atomicfile.ReadJSON(s.intentPath(containerID), &in)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil || in.ContainerID != containerID || !in.CallerPaused || time.Now().After(in.ExpiresAt) {
		return false, err
	}
	path, err := s.pauseClaimPath(containerID, in.Nonce)
	if err != nil {
		return false, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claiming the pause of the fork of %s: %w", containerID, err)
	}
	// The claim names the intent's client, so that it goes once the
	// client has died (removeStaleResults).
	err = json.NewEncoder(f).Encode(intentMark{Version: FormatVersion, Nonce: in.Nonce, Client: in.Client})
	return true, errors.Join(err, f.Close())
}

// intentMark is the content of a pause claim and of a release: whose they
// are.
type intentMark struct {
	Version int           `json:"version"`
	Nonce   string        `json:"nonce"`
	Client  journal.Owner `json:"client"`
}

func (s Store) pauseClaimPath(containerID, nonce string) (string, error) {
	return s.intentFile(containerID, nonce, ".pause")
}

// intentFile is the file of suffix that goes with the intent of this nonce
// (its result, cancellation, pause claim or release).
func (s Store) intentFile(containerID, nonce, suffix string) (string, error) {
	path, err := s.intentResultPath(containerID, nonce)
	return strings.TrimSuffix(path, ".result.json") + suffix, err
}

// MarkIntentReleased tells the client of intent that its capture is done:
// the source runs on and the plan is written, while the caller of the
// checkpoint may still be at work (containerd archives the container's
// filesystem before its call returns). The client can start what does not
// depend on the caller's answer: a Kubernetes fork makes its sibling pods.
// Only a client whose checkpoint's caller pauses the source (CallerPaused:
// containerd's) waits for it; for another nothing is marked.
func (s Store) MarkIntentReleased(in *Intent) error {
	if !in.CallerPaused {
		return nil
	}
	path, err := s.intentFile(in.ContainerID, in.Nonce, ".released")
	if err != nil {
		return err
	}
	return atomicfile.WriteJSON(path, intentMark{Version: FormatVersion, Nonce: in.Nonce, Client: in.Client}, 0o600)
}

// IntentReleased reports whether the capture of the intent with this nonce
// is done (MarkIntentReleased).
func (s Store) IntentReleased(containerID, nonce string) bool {
	path, err := s.intentFile(containerID, nonce, ".released")
	if err != nil {
		return false
	}
	_, err = os.Stat(path)
	return err == nil
}

// PauseClaimed reports whether the pause of the checkpoint's caller was
// claimed for the intent with this nonce (ClaimCallerPause): the caller
// paused a running container, and owes it a resume.
func (s Store) PauseClaimed(containerID, nonce string) bool {
	path, err := s.pauseClaimPath(containerID, nonce)
	if err != nil {
		return false
	}
	_, err = os.Stat(path)
	return err == nil
}

// RemoveIntent withdraws an intent that was not consumed, if it is still the
// one with this nonce (another fork may have replaced it), and then what
// went with it: the claim on its caller's pause, the mark of its release.
func (s Store) RemoveIntent(containerID, nonce string) error {
	defer func() {
		for _, suffix := range []string{".pause", ".released"} {
			if path, err := s.intentFile(containerID, nonce, suffix); err == nil {
				os.Remove(path)
			}
		}
	}()
	path := s.intentPath(containerID)
	var in Intent
	err := atomicfile.ReadJSON(path, &in)
	if errors.Is(err, os.ErrNotExist) || (err == nil && in.Nonce != nonce) {
		return nil
	}
	// An intent that cannot be read is no one's: it goes too.
	err = os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// IntentResult is what tclone leaves for the fork client when the capture
// an intent asked for fails. Podman runs the runtime's checkpoint without
// --log and discards its stderr, so its own error says only that the
// runtime exited with status 1; the client reads tclone's reason here.
type IntentResult struct {
	Version int    `json:"version"`
	Nonce   string `json:"nonce"`
	Error   string `json:"error"`
	// Client is the intent's client: once it has died, nobody will read
	// the result.
	Client journal.Owner `json:"client"`
}

func (s Store) intentResultPath(containerID, nonce string) (string, error) {
	if nonce == "" || strings.ContainsAny(nonce, "/\x00") || nonce == "." || nonce == ".." {
		return "", fmt.Errorf("fork intent for %s has an unusable nonce %q", containerID, nonce)
	}
	return filepath.Join(s.IntentsDir(), containerID+"."+nonce+".result.json"), nil
}

// WriteIntentResult records why the capture in intent failed, for the
// client that left the intent. Results nobody collected (their client
// died) are removed once they are older than IntentTTL.
func (s Store) WriteIntentResult(in *Intent, failure error) error {
	path, err := s.intentResultPath(in.ContainerID, in.Nonce)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.IntentsDir(), 0o700); err != nil {
		return fmt.Errorf("creating intent directory: %w", err)
	}
	s.removeStaleResults()
	return atomicfile.WriteJSON(path, IntentResult{Version: FormatVersion, Nonce: in.Nonce, Error: failure.Error(), Client: in.Client}, 0o600)
}

// TakeIntentResult returns and removes the failure tclone recorded for the
// intent with this nonce, or "" when it recorded none.
func (s Store) TakeIntentResult(containerID, nonce string) (string, error) {
	path, err := s.intentResultPath(containerID, nonce)
	if err != nil {
		return "", err
	}
	var r IntentResult
	err = atomicfile.ReadJSON(path, &r)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	os.Remove(path)
	if err != nil {
		return "", fmt.Errorf("reading tclone's result for the fork of %s: %w", containerID, err)
	}
	return r.Error, nil
}

// removeStaleResults removes results, cancellations, pause claims and
// releases older than IntentTTL, and results, claims and releases whose
// client has died.
func (s Store) removeStaleResults() {
	var paths []string
	for _, suffix := range []string{".result.json", ".cancel", ".pause", ".released"} {
		m, _ := filepath.Glob(filepath.Join(s.IntentsDir(), "*"+suffix))
		paths = append(paths, m...)
	}
	for _, path := range paths {
		if st, err := os.Stat(path); err == nil && time.Since(st.ModTime()) > IntentTTL {
			os.Remove(path)
			continue
		}
		if strings.HasSuffix(path, ".cancel") {
			continue
		}
		var mark intentMark
		if atomicfile.ReadJSON(path, &mark) == nil && mark.Client.Pid != 0 && !mark.Client.Running() {
			os.Remove(path)
		}
	}
}

func (s Store) intentCancelPath(containerID, nonce string) (string, error) {
	return s.intentFile(containerID, nonce, ".cancel")
}

// CancelIntent tells the capture of the intent with this nonce that its
// client gave up (the user interrupted the fork): the capture stops and
// lets the source go at once instead of finishing a plan nobody will use.
func (s Store) CancelIntent(containerID, nonce string) error {
	path, err := s.intentCancelPath(containerID, nonce)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.IntentsDir(), 0o700); err != nil {
		return fmt.Errorf("creating intent directory: %w", err)
	}
	return os.WriteFile(path, nil, 0o600)
}

// IntentCancelled reports whether the client of intent cancelled it.
func (s Store) IntentCancelled(in *Intent) bool {
	path, err := s.intentCancelPath(in.ContainerID, in.Nonce)
	if err != nil {
		return false
	}
	_, err = os.Stat(path)
	return err == nil
}

// RemoveIntentCancel removes the cancellation of an intent, once its
// capture has ended.
func (s Store) RemoveIntentCancel(containerID, nonce string) {
	if path, err := s.intentCancelPath(containerID, nonce); err == nil {
		os.Remove(path)
	}
}

func (s Store) intentLockPath(containerID string) string {
	return filepath.Join(s.LocksDir(), "intent-"+containerID+".lock")
}

// LockIntents serialises fork requests for one container across processes:
// between leaving an intent and the checkpoint that consumes it, no other
// fork of that container may leave or remove one.
func (s Store) LockIntents(containerID string) (unlock func(), err error) {
	unlock, err = Lock(context.Background(), s.intentLockPath(containerID))
	if err != nil {
		return nil, fmt.Errorf("locking fork requests of %s: %w", containerID, err)
	}
	return unlock, nil
}

// Reference is what a fork checkpoint leaves in Podman's checkpoint
// directory in place of CRIU's images: a pointer to the plan in this host's
// store. It makes Podman's export archive a few kilobytes.
type Reference struct {
	Version  int    `json:"version"`
	PlanID   string `json:"plan_id"`
	PlanDir  string `json:"plan_dir"`
	SourceID string `json:"source_id"`
	BootID   string `json:"boot_id"`
}

// ReferenceTo is a reference, made on this boot, to plan id in dir.
func ReferenceTo(id, dir, sourceID string) Reference {
	boot, _ := procfs.BootID()
	return Reference{Version: FormatVersion, PlanID: id, PlanDir: dir, SourceID: sourceID, BootID: boot}
}

// ReferenceFile is the reference's name inside a checkpoint directory.
const ReferenceFile = "tclone-plan.json"

// WriteReference stores a reference in a checkpoint directory.
func WriteReference(checkpointDir string, ref Reference) error {
	ref.Version = FormatVersion
	ref.BootID, _ = procfs.BootID()
	return atomicfile.WriteJSON(filepath.Join(checkpointDir, ReferenceFile), ref, 0o600)
}

// RemoveReference removes a reference from a checkpoint directory, if it
// holds one: an ordinary checkpoint written there is no fork plan's.
func RemoveReference(checkpointDir string) error {
	if err := os.Remove(filepath.Join(checkpointDir, ReferenceFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing an earlier fork's plan reference from %s: %w", checkpointDir, err)
	}
	return nil
}

// ReadReference loads a reference from a checkpoint directory. It returns
// nil when the directory holds an ordinary checkpoint.
func ReadReference(checkpointDir string) (*Reference, error) {
	var ref Reference
	err := atomicfile.ReadJSON(filepath.Join(checkpointDir, ReferenceFile), &ref)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// References written before boot IDs were trimmed end in a newline.
	if boot, _ := procfs.BootID(); strings.TrimSpace(ref.BootID) != boot {
		return nil, fmt.Errorf("this checkpoint refers to fork plan %s, which lived in memory on another host or an earlier boot; fork plans cannot be moved, so fork the container again", ref.PlanID)
	}
	return &ref, nil
}

// CollectIntents removes the intents no checkpoint will take: expired, or
// left by a client that died before its checkpoint (its lock is free then),
// with the results and cancellations nobody collected. It returns the
// containers whose intent it removed.
func (s Store) CollectIntents() ([]string, error) {
	s.removeStaleResults()
	entries, err := readDir(s.IntentsDir())
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ent := range entries {
		name := ent.Name()
		id, ok := strings.CutSuffix(name, ".json")
		switch {
		case strings.Contains(name, ".json.taken"):
			// A checkpoint killed while it took the intent: its PID ends
			// the name.
			pid, err := strconv.Atoi(name[strings.LastIndex(name, ".taken")+len(".taken"):])
			st, serr := ent.Info()
			if (err == nil && !procfs.Exists(pid)) || (serr == nil && time.Since(st.ModTime()) > IntentTTL) {
				os.Remove(filepath.Join(s.IntentsDir(), name))
			}
			continue
		case !ok || strings.Contains(id, "."):
			continue // results and cancellations: removeStaleResults
		}
		gone, err := s.removeIntentIfUnwanted(id)
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			removed = append(removed, id)
		}
	}
	return removed, errors.Join(errs...)
}

// removeIntentIfUnwanted removes the intent for containerID if it expired
// or its client died, under the container's intent lock, which a live
// client holds from its intent until its checkpoint returns.
func (s Store) removeIntentIfUnwanted(containerID string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	unlock, err := Lock(ctx, s.intentLockPath(containerID))
	if err != nil {
		return false, nil // held: its client is at work
	}
	defer unlock()
	path := s.intentPath(containerID)
	var in Intent
	if err := atomicfile.ReadJSON(path, &in); err == nil && time.Now().Before(in.ExpiresAt) && in.Client.Running() {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("removing the unwanted fork intent of %s: %w", containerID, err)
	}
	return true, nil
}
