package scheduler_test

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"

	"github.com/dynrunner/dynrunner/internal/workload"
)

func mustProto(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// bundleOverride presents one source's SVID but trusts another CA's bundle.
type bundleOverride struct {
	workload.Source
	ca *workload.DevCA
}

func (b bundleOverride) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return b.ca.Bundle(), nil
}
