package sluicev1

// KeyRegion is what the status says of the key (tenant, class) in region:
// nil when x is nil or does not list them (Status lists only the most
// contended keys).
func (x *StatusResponse) KeyRegion(tenant, class, region string) *KeyRegionStatus {
	for _, ks := range x.GetKeys() {
		if ks.GetKey().GetTenant() != tenant || ks.GetKey().GetClass() != class {
			continue
		}
		for _, rs := range ks.GetRegions() {
			if rs.GetRegion() == region {
				return rs
			}
		}
	}
	return nil
}
