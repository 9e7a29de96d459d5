package githubtest

import "slices"

// SetTokens replaces the accepted personal access tokens, as an operator who rotates a token
// and revokes the old one does: calls with a token not in tokens get 401 Bad credentials.
func (s *Server) SetTokens(tokens ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Tokens = slices.Clone(tokens)
}
