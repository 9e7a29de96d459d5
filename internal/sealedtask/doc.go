// Package sealedtask is the form in which a forge task is kept in JetStream: the scheduler
// seals it at the claim and records its digest with the assignment; the facade opens it when
// the environment's runner fetches it.
//
// A task is sealed with the controller's sealbox.Box, bound to its id through the additional
// authenticated data (AAD), so the sealed task of one assignment does not open as another's;
// Open also checks the sealed bytes against the digest recorded at the claim.
package sealedtask
