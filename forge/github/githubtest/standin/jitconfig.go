package standin

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrJITConfig: an encoded JIT configuration could not be decoded.
var ErrJITConfig = errors.New("malformed JIT configuration")

// JITConfig is what the fake's encoded JIT configuration holds, decoded: the fields of the
// runner's .runner file it fills, and the credential of its .credentials file.
type JITConfig struct {
	AgentID    int    `json:"AgentId"`
	AgentName  string `json:"AgentName"`
	PoolID     int    `json:"PoolId"`
	ServerURL  string `json:"ServerUrl"`
	GitHubURL  string `json:"GitHubUrl"`
	WorkFolder string `json:"WorkFolder"`
	Ephemeral  bool   `json:"Ephemeral"`
	// Credential is the runner's secret (the clientId of the OAuth credentials in .credentials).
	Credential string `json:"-"`
}

type jitCredentials struct {
	Scheme string `json:"Scheme"`
	Data   struct {
		ClientID         string `json:"clientId"`
		AuthorizationURL string `json:"authorizationUrl"`
	} `json:"Data"`
}

// EncodeJITConfig encodes cfg as the runner's --jitconfig argument: base64 of a JSON object
// mapping the file names .runner and .credentials to their base64 contents. authURL goes into
// .credentials as the OAuth authorization URL, which the stand-in does not use.
func EncodeJITConfig(cfg JITConfig, authURL string) (string, error) {
	runnerFile, err := json.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("standin: encode .runner: %w", err)
	}
	var creds jitCredentials
	creds.Scheme = "OAuth"
	creds.Data.ClientID = cfg.Credential
	creds.Data.AuthorizationURL = authURL
	credFile, err := json.Marshal(creds)
	if err != nil {
		return "", fmt.Errorf("standin: encode .credentials: %w", err)
	}
	files, err := json.Marshal(map[string]string{
		".runner":      base64.StdEncoding.EncodeToString(runnerFile),
		".credentials": base64.StdEncoding.EncodeToString(credFile),
	})
	if err != nil {
		return "", fmt.Errorf("standin: encode files: %w", err)
	}
	return base64.StdEncoding.EncodeToString(files), nil
}

// DecodeJITConfig decodes an encoded JIT configuration of the fake's. Errors wrap ErrJITConfig.
func DecodeJITConfig(encoded string) (JITConfig, error) {
	var cfg JITConfig
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return cfg, fmt.Errorf("standin: decode JIT config: %w: not base64: %w", ErrJITConfig, err)
	}
	var files map[string]string
	if err := json.Unmarshal(raw, &files); err != nil {
		return cfg, fmt.Errorf("standin: decode JIT config: %w: not a JSON object of files: %w", ErrJITConfig, err)
	}
	file := func(name string, v any) error {
		enc, ok := files[name]
		if !ok {
			return fmt.Errorf("standin: decode JIT config: %w: no file %s", ErrJITConfig, name)
		}
		b, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return fmt.Errorf("standin: decode JIT config file %s: %w: %w", name, ErrJITConfig, err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("standin: decode JIT config file %s: %w: %w", name, ErrJITConfig, err)
		}
		return nil
	}
	var creds jitCredentials
	if err := errors.Join(file(".runner", &cfg), file(".credentials", &creds)); err != nil {
		return JITConfig{}, err
	}
	cfg.Credential = creds.Data.ClientID
	return cfg, nil
}
