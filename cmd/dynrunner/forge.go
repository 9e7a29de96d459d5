package main

import (
	"context"
	"net/http"
	"time"

	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/config"
)

func connectForge(ctx context.Context, cfg config.Controller, labels []string) (*gitea.Client, error) {
	return gitea.Connect(ctx, gitea.Config{
		URL: cfg.GiteaURL, UUIDFile: cfg.GiteaRunnerUUIDFile, TokenFile: cfg.GiteaRunnerTokenFile,
		RegistrationTokenFile: cfg.GiteaRunnerRegTokenFile, StateDir: cfg.StateDir,
		Name: cfg.GiteaRunnerName, Labels: labels, Version: "dynrunner-" + version,
		HTTP: &http.Client{Timeout: 60 * time.Second},
	})
}

func httpOK(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
