package local

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/dynrunner/dynrunner/internal/envlock"
)

// lockEnv takes the exclusive lock of environment id (see envlock.Lock).
func (b *Backend) lockEnv(ctx context.Context, id string) (unlock func(remove bool), err error) {
	return envlock.Lock(ctx, filepath.Join(b.root, locksDir), id)
}

// errorf formats a package error: "local: <op> <id>: <err>".
func errorf(op, id string, err error) error {
	return fmt.Errorf("local: %s %s: %w", op, id, err)
}
