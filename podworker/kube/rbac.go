package kube

import rbacv1 "k8s.io/api/rbac/v1"

// RBACRules are the permissions the backend needs in its namespace, for a Role bound to the
// controller's service account (deploy/ keeps a copy; the tests run the conformance suite
// with exactly these). Listing Secrets lets the controller read every Secret of the
// namespace: give dynrunner a namespace of its own.
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	}
}
