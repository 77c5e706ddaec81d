package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a server the harness started and measures.
type proc struct {
	name string
	addr string // host:port it listens on
	cmd  *exec.Cmd
	log  bytes.Buffer
}

// start runs a server in the background and waits until addr accepts
// connections. The server is killed by stop.
func start(name, addr string, env []string, path string, args ...string) (*proc, error) {
	p := &proc{name: name, addr: addr, cmd: exec.Command(path, args...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	// A group of its own, so that stop kills its children too (nginx's
	// workers), which would otherwise hold its output open.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("%s does not listen on %s after 15s:\n%s", name, addr, p.log.String())
}

func (p *proc) stop() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
}

// cpu is the CPU time the server has used so far, user and system, its
// child processes' included (nginx's workers).
func (p *proc) cpu() (time.Duration, error) {
	var sum time.Duration
	for _, pid := range p.pids() {
		c, err := cpuTime(pid)
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

// pids are the server's process and its children's.
func (p *proc) pids() []int {
	pid := p.cmd.Process.Pid
	pids := []int{pid}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		f, err := statFields(child)
		if err != nil {
			continue // gone since the listing
		}
		if len(f) > 1 && f[1] == strconv.Itoa(pid) { // the parent's PID
			pids = append(pids, child)
		}
	}
	return pids
}

// cpuTime is the user+system CPU time of a process, from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// utime and stime, the 14th and 15th fields of the whole line.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

// statFields returns the fields of /proc/PID/stat after the
// parenthesised command name, which may hold spaces: the state, the
// parent's PID, and so on.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return nil, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, b)
	}
	return strings.Fields(string(b[i+2:])), nil
}

// rssOf is the servers' resident memory, summed, in MiB; 0 if unknown.
func rssOf(servers []*proc) float64 {
	var kb int64
	for _, p := range servers {
		for _, pid := range p.pids() {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				return 0
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
					var n int64
					fmt.Sscan(v, &n)
					kb += n
				}
			}
		}
	}
	return float64(kb) / 1024
}

// selfCPU is the CPU time of this process, user and system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childCPU runs cmd to completion and returns its output and the CPU time
// it used, user and system, as the kernel accounted it.
func childCPU(ctx context.Context, name string, args ...string) ([]byte, time.Duration, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, 0, fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return out, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// buildService builds the service's binary into dir as the Dockerfile does
// (without the version stamp) and returns its path.
func buildService(root, dir string) (string, error) {
	bin := filepath.Join(dir, "ratelimiter")
	cmd := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-o", bin, "./cmd/service")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the service: %w\n%s", err, out)
	}
	return bin, nil
}

// goBuild builds the package pkg of the module in dir into out.
func goBuild(dir, pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// call sends one request to a service and fails unless it answers 2xx.
func call(method, url, body string) ([]byte, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s %s", method, url, resp.Status, b)
	}
	return b, nil
}
