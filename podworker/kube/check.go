package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrForbidden reports (from Check) permissions of RBACRules the controller lacks.
var ErrForbidden = errors.New("kube: missing permissions")

// Check contacts the cluster and checks that the controller may do in the namespace what the
// backend does (RBACRules), through SelfSubjectAccessReviews. The controller calls it at boot,
// so a wrong kubeconfig, namespace or Role is a boot error rather than a failed job.
func (b *Backend) Check(ctx context.Context) error {
	reviews := b.client.AuthorizationV1().SelfSubjectAccessReviews()
	var missing []string
	for _, rule := range RBACRules() {
		for _, res := range rule.Resources {
			resource, sub, _ := strings.Cut(res, "/")
			for _, verb := range rule.Verbs {
				r, err := reviews.Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
					ResourceAttributes: &authzv1.ResourceAttributes{
						Namespace: b.ns, Verb: verb, Resource: resource, Subresource: sub,
					},
				}}, metav1.CreateOptions{})
				if err != nil {
					return fmt.Errorf("kube: check: %w", err)
				}
				if !r.Status.Allowed {
					missing = append(missing, verb+" "+res)
				}
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w in namespace %s: %s (bind a Role with kube.RBACRules)", ErrForbidden, b.ns, strings.Join(missing, ", "))
	}
	return nil
}
