package githubtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v4"
)

// installationTokenTTL and registrationTokenTTL are GitHub's: one hour each.
const (
	installationTokenTTL = time.Hour
	registrationTokenTTL = time.Hour
	maxAppJWTLifetime    = 10 * time.Minute
)

// ExpireInstallationTokens revokes every installation token issued so far, as their hour passing
// would: registration-token calls with them get 401 Bad credentials.
func (s *Server) ExpireInstallationTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.installTokens)
}

// ExpireAdminTokens revokes every Actions-service admin token issued so far: calls with them get
// 401. The client refreshes its admin token only by the token's exp claim, so it does not
// recover from this by itself; compare Options.AdminTokenTTL.
func (s *Server) ExpireAdminTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.adminTokens)
}

func bearer(r *http.Request, scheme string) (string, bool) {
	v := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(v, scheme+" ")
	return tok, ok && tok != ""
}

func (s *Server) rejectAuth(w http.ResponseWriter, message string) {
	s.mu.Lock()
	s.counts.RejectedAuth++
	s.mu.Unlock()
	writeGitHubError(w, http.StatusUnauthorized, message)
}

// verifyAppJWT checks raw as GitHub checks an App's JWT: RS256 by the App's key, issued by the
// App, valid now, for at most ten minutes.
func (s *Server) verifyAppJWT(raw string) error {
	app := s.opts.App
	if app == nil {
		return errors.New("no GitHub App is configured in the fake")
	}
	claims := &jwt.RegisteredClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return app.PublicKey, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodRS256.Alg()}))
	if err != nil {
		return fmt.Errorf("verify App JWT: %w", err)
	}
	if claims.Issuer != app.ClientID && claims.Issuer != strconv.FormatInt(app.ID, 10) {
		return fmt.Errorf("App JWT issuer %q is neither the App's client ID nor its ID", claims.Issuer)
	}
	if claims.IssuedAt == nil || claims.ExpiresAt == nil {
		return errors.New("App JWT lacks iat or exp")
	}
	if claims.ExpiresAt.Sub(claims.IssuedAt.Time) > maxAppJWTLifetime {
		return errors.New("App JWT lives longer than ten minutes")
	}
	return nil
}

// handleInstallationToken is POST /app/installations/{id}/access_tokens.
func (s *Server) handleInstallationToken(w http.ResponseWriter, r *http.Request) {
	raw, ok := bearer(r, "Bearer")
	if !ok {
		s.rejectAuth(w, "A JSON web token could not be decoded")
		return
	}
	if err := s.verifyAppJWT(raw); err != nil {
		s.rejectAuth(w, "githubtest: "+err.Error())
		return
	}
	if r.PathValue("id") != strconv.FormatInt(s.opts.App.InstallationID, 10) {
		writeGitHubError(w, http.StatusNotFound, "Not Found")
		return
	}
	tok := randomToken("ghs_")
	exp := time.Now().Add(installationTokenTTL).UTC()
	s.mu.Lock()
	s.installTokens[tok] = exp
	s.counts.InstallationTokens++
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{"token": tok, "expires_at": exp})
}

// restAuth authorises a call of the REST API as GitHub does: "Authorization: Bearer <token>"
// (or "token <token>") with an installation token that has not expired or a personal access
// token the fake accepts. It answers 401 itself and reports false otherwise.
func (s *Server) restAuth(w http.ResponseWriter, r *http.Request) bool {
	tok, ok := bearer(r, "Bearer")
	if !ok {
		tok, ok = bearer(r, "token")
	}
	if !ok {
		s.rejectAuth(w, "Requires authentication")
		return false
	}
	s.mu.Lock()
	exp, isInstall := s.installTokens[tok]
	valid := (isInstall && time.Now().Before(exp)) || slices.Contains(s.opts.Tokens, tok)
	s.mu.Unlock()
	if !valid {
		s.rejectAuth(w, "Bad credentials")
	}
	return valid
}

// handleRegistrationToken is POST /repos|orgs|enterprises/.../actions/runners/registration-token.
func (s *Server) handleRegistrationToken(w http.ResponseWriter, r *http.Request) {
	if !s.restAuth(w, r) {
		return
	}
	now := time.Now()
	reg := randomToken("AREG")
	regExp := now.Add(registrationTokenTTL).UTC()
	s.mu.Lock()
	s.regTokens[reg] = regExp
	s.counts.RegistrationTokens++
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{"token": reg, "expires_at": regExp})
}

// handleRunnerRegistration is POST /actions/runner-registration: a registration token for the
// Actions-service URL and an admin token.
func (s *Server) handleRunnerRegistration(w http.ResponseWriter, r *http.Request) {
	reg, ok := bearer(r, "RemoteAuth")
	if !ok {
		s.rejectAuth(w, "Requires RemoteAuth with a registration token")
		return
	}
	var body struct {
		URL         string `json:"url"`
		RunnerEvent string `json:"runner_event"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.URL == "" || body.RunnerEvent != "register" {
		writeGitHubError(w, http.StatusBadRequest, "githubtest: body must be {\"url\": <config URL>, \"runner_event\": \"register\"}")
		return
	}
	now := time.Now()
	s.mu.Lock()
	exp, known := s.regTokens[reg]
	s.mu.Unlock()
	if !known || now.After(exp) {
		s.rejectAuth(w, "Bad registration token")
		return
	}
	jti := randomToken("")
	claims := jwt.RegisteredClaims{
		ID:        jti,
		Subject:   "githubtest-admin",
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(s.opts.AdminTokenTTL)),
	}
	admin, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(s.adminKey)
	if err != nil {
		writeGitHubError(w, http.StatusInternalServerError, "githubtest: sign admin token: "+err.Error())
		return
	}
	s.mu.Lock()
	s.adminTokens[jti] = true
	s.counts.AdminTokens++
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"url": s.ActionsServiceURL(), "token": admin, "token_schema": "OAuthAccessToken"})
}

// admin authorises an Actions-service call by its admin token.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return s.apiVersion(func(w http.ResponseWriter, r *http.Request) {
		raw, ok := bearer(r, "Bearer")
		if !ok {
			s.rejectAuth(w, "githubtest: Actions-service call without a bearer admin token")
			return
		}
		claims := &jwt.RegisteredClaims{}
		_, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return s.adminKey, nil },
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}))
		if err != nil {
			s.rejectAuth(w, "githubtest: admin token: "+err.Error())
			return
		}
		s.mu.Lock()
		valid := s.adminTokens[claims.ID]
		s.mu.Unlock()
		if !valid {
			s.rejectAuth(w, "githubtest: admin token revoked")
			return
		}
		h(w, r)
	})
}

// apiVersion refuses Actions-service calls without the api-version query parameter.
func (s *Server) apiVersion(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("api-version") == "" {
			writeException(w, http.StatusBadRequest, "VssInvalidApiVersionException", "githubtest: api-version query parameter is required")
			return
		}
		h(w, r)
	}
}
