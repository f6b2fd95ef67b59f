package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kvtop/kvtop/record"
	"github.com/kvtop/kvtop/ui"
)

// recordIn is the dashboard's R: it opens a new recording in dir, named after the time
// (kvtop-20260102-150405.jsonl, with -2, -3 … when that name is taken: a file is never
// overwritten).
func recordIn(dir string, now func() time.Time) func() (ui.Recorder, string, error) {
	return func() (ui.Recorder, string, error) {
		base := now().Format("kvtop-20060102-150405")
		for i := 1; i < 100; i++ {
			name := base + ".jsonl"
			if i > 1 {
				name = fmt.Sprintf("%s-%d.jsonl", base, i)
			}
			f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			switch {
			case errors.Is(err, fs.ErrExist):
				continue
			case err != nil:
				return nil, "", fmt.Errorf("record: %w", err)
			}
			return record.NewRecorder(f), name, nil
		}
		return nil, "", fmt.Errorf("record: %s.jsonl and 98 more names are taken in %s", base, dir)
	}
}
