package facade_test

import (
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/internal/workload"
)

// bundleOverride presents one source's SVID but trusts another CA's bundle.
type bundleOverride struct {
	workload.Source
	ca *workload.DevCA
}

func (b bundleOverride) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return b.ca.Bundle(), nil
}
