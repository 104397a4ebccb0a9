// The pod sandbox's process for the dev kubelet (kubelet.sh): what Kubernetes' build/pause/linux/pause.c
// does, in Go so that build.sh needs no C toolchain (CGO_ENABLED=0 gives a static binary). It holds the
// pod's namespaces, reaps the zombies it inherits as their PID 1, and exits at SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
