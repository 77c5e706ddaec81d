package redistest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// Image is the Redis image every helper starts. No registry can be reached
// from the test machines, so it is built from this machine's redis-server
// (Debian's package) when the engine does not have it yet.
const Image = "local/redis:7"

// serverBinary is where Debian's redis-server package installs the server.
// It is a symbolic link to redis-check-rdb: the binary picks its mode from
// the name it is run under, so it is copied under the name redis-server.
const serverBinary = "/usr/bin/redis-server"

var (
	imageOnce sync.Once
	imageErr  error
)

// EnsureImage builds Image unless the Docker engine has it, for tests that
// run Redis containers of their own (on a network of theirs, say).
func EnsureImage(ctx context.Context) error { return ensureImage(ctx) }

// ensureImage builds Image once per test binary unless the engine has it.
func ensureImage(ctx context.Context) error {
	imageOnce.Do(func() { imageErr = buildImageIfMissing(ctx) })
	return imageErr
}

func buildImageIfMissing(ctx context.Context) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.ImageInspect(ctx, Image); err == nil {
		return nil
	}
	var root bytes.Buffer
	if err := rootFS(&root); err != nil {
		return fmt.Errorf("build %s from %s: %w", Image, serverBinary, err)
	}
	res, err := cli.ImageImport(ctx,
		client.ImageImportSource{Source: &root, SourceName: "-"},
		Image,
		client.ImageImportOptions{Changes: []string{`ENTRYPOINT ["/usr/bin/redis-server"]`}})
	if err != nil {
		return fmt.Errorf("import %s: %w", Image, err)
	}
	defer res.Close()
	// The engine reports progress, and failures, as a JSON stream.
	out, err := io.ReadAll(res)
	if err != nil {
		return fmt.Errorf("import %s: %w", Image, err)
	}
	if bytes.Contains(out, []byte(`"error"`)) {
		return fmt.Errorf("import %s: %s", Image, out)
	}
	return nil
}

// rootFS writes a tar archive of the smallest root file system that runs
// redis-server: the binary, the shared libraries ldd lists for it, the
// dynamic loader, and a writable /tmp for the server's working directory.
func rootFS(w io.Writer) error {
	if _, err := os.Stat(serverBinary); err != nil {
		return fmt.Errorf("%w (install Debian's redis-server package)", err)
	}
	libs, err := sharedLibraries(serverBinary)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	addDirs := func(p string) error {
		var parents []string
		for d := filepath.Dir(p); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append(parents, d)
			dirs[d] = true
		}
		for i := len(parents) - 1; i >= 0; i-- {
			h := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(parents[i], "/") + "/", Mode: 0o755}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}); err != nil {
		return err
	}
	dirs["/tmp"] = true
	files := append([]string{serverBinary}, libs...)
	for _, f := range files {
		if err := addDirs(f); err != nil {
			return err
		}
		// os.ReadFile follows symbolic links, like cp -L.
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f, "/"), Mode: 0o755, Size: int64(len(data))}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// sharedLibraries returns the absolute paths ldd prints for bin: the
// libraries ("libc.so.6 => /lib/.../libc.so.6 (0x...)") and the loader
// ("/lib64/ld-linux-x86-64.so.2 (0x...)").
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if strings.HasPrefix(f, "/") && (i == 0 || fields[i-1] == "=>") {
				libs = append(libs, f)
				break
			}
		}
	}
	if len(libs) == 0 {
		return nil, errors.New("ldd listed no libraries for " + bin)
	}
	return libs, sc.Err()
}
