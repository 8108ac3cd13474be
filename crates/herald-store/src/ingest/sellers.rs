//! Seller profiles: version-guarded upserts, tombstone deletes, and batch lookups.

use std::collections::HashMap;

use herald_core::consent::{Suppressed, SuppressionReason};
use herald_core::{SellerProfile, SellerRecord};

use crate::destination::DestinationKey;
use crate::{Hot, Result, Sql};

/// The profiles of a batch's sellers (sellers_pkey).
pub(crate) const SELLERS_BY_KEY: &str =
    "SELECT s.marketplace_id, s.seller_id, s.email, s.phone, s.locale, s.email_opt_in, s.sms_opt_in, s.version
     FROM sellers s JOIN unnest($1::text[], $2::text[]) AS k(marketplace_id, seller_id)
       ON s.marketplace_id = k.marketplace_id AND s.seller_id = k.seller_id";

/// The live suppression-list entries of destinations `$1` (channels), `$2` (addresses),
/// `$3` (their keyed digests, see `destination`), by position (suppressions_live): an
/// entry keyed now, or one made before V17 under the unkeyed digest, until retention
/// re-keys it.
pub(crate) const SUPPRESSED_DESTINATIONS: &str = "SELECT k.n, x.reason
     FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS k(channel, address, digest, n)
     JOIN suppressions x
       ON x.channel = k.channel AND x.lifted_at IS NULL
      AND x.destination_digest = ANY (ARRAY[k.digest, herald_destination_digest(k.channel, k.address)])";

/// Folds the records of one batch into the final record per seller, in offset order: a
/// tombstone deletes whatever came before; among upserts the highest version wins.
pub fn fold_seller_records(records: Vec<SellerRecord>) -> Vec<SellerRecord> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut last: HashMap<(String, String), SellerRecord> = HashMap::new();
    for rec in records {
        let (m, s) = rec.ids();
        let key = (m.to_owned(), s.to_owned());
        let keep_previous = match (last.get(&key), &rec) {
            (Some(SellerRecord::Upsert(prev)), SellerRecord::Upsert(new)) => prev.version >= new.version,
            _ => false,
        };
        if !last.contains_key(&key) {
            order.push(key.clone());
        }
        if !keep_previous {
            last.insert(key, rec);
        }
    }
    // Sorted by key so that concurrent batches lock seller rows in one order.
    order.sort();
    order.into_iter().filter_map(|k| last.remove(&k)).collect()
}

/// Applies folded records (at most one per seller): upserts only when newer than the
/// stored version, deletes for tombstones. Returns (upserted, deleted) row counts.
pub(crate) async fn apply(client: &impl Sql, records: &[SellerRecord]) -> Result<(u64, u64)> {
    let mut up = UpsertColumns::default();
    let (mut del_m, mut del_s) = (Vec::new(), Vec::new());
    for rec in records {
        match rec {
            SellerRecord::Upsert(p) => up.push(p),
            SellerRecord::Delete {
                marketplace_id,
                seller_id,
            } => {
                del_m.push(marketplace_id.as_str());
                del_s.push(seller_id.as_str());
            }
        }
    }
    let mut upserted = 0;
    if !up.marketplace.is_empty() {
        // sellers_pkey; the WHERE keeps a replayed or reordered older version from winning.
        upserted = client
            .execute(
                "INSERT INTO sellers (marketplace_id, seller_id, email, phone, locale, email_opt_in, sms_opt_in, version)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], $7::bool[], $8::int8[])
                 ON CONFLICT ON CONSTRAINT sellers_pkey DO UPDATE SET
                    email = EXCLUDED.email, phone = EXCLUDED.phone, locale = EXCLUDED.locale,
                    email_opt_in = EXCLUDED.email_opt_in, sms_opt_in = EXCLUDED.sms_opt_in,
                    version = EXCLUDED.version, updated_at = now()
                 WHERE sellers.version < EXCLUDED.version",
                &[
                    &up.marketplace,
                    &up.seller,
                    &up.email,
                    &up.phone,
                    &up.locale,
                    &up.email_opt_in,
                    &up.sms_opt_in,
                    &up.version,
                ],
            )
            .await?;
    }
    let mut deleted = 0;
    if !del_m.is_empty() {
        // sellers_pkey
        deleted = client
            .execute(
                "DELETE FROM sellers s USING unnest($1::text[], $2::text[]) AS d(marketplace_id, seller_id)
                 WHERE s.marketplace_id = d.marketplace_id AND s.seller_id = d.seller_id",
                &[&del_m, &del_s],
            )
            .await?;
    }
    Ok((upserted, deleted))
}

/// The stored profiles of the given sellers, each with its destinations' entries on the
/// suppression list.
pub(crate) async fn lookup(
    client: &impl Sql,
    key: &DestinationKey,
    keys: &[(String, String)],
) -> Result<HashMap<(String, String), SellerProfile>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let m: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let s: Vec<&str> = keys.iter().map(|k| k.1.as_str()).collect();
    let rows = client.query(Hot(SELLERS_BY_KEY), &[&m, &s]).await?;
    let mut profiles: Vec<SellerProfile> = rows
        .into_iter()
        .map(|r| SellerProfile {
            marketplace_id: r.get(0),
            seller_id: r.get(1),
            email: r.get(2),
            phone: r.get(3),
            locale: r.get(4),
            email_opt_in: r.get(5),
            sms_opt_in: r.get(6),
            version: r.get(7),
            suppressed: Suppressed::default(),
        })
        .collect();
    mark_suppressed(client, key, &mut profiles).await?;
    Ok(profiles
        .into_iter()
        .map(|p| ((p.marketplace_id.clone(), p.seller_id.clone()), p))
        .collect())
}

/// Fills each profile's `suppressed` from the suppression list: one statement for the
/// batch, after the profiles (their addresses are digested here, with the key PostgreSQL
/// never sees).
async fn mark_suppressed(
    client: &impl Sql,
    key: &DestinationKey,
    profiles: &mut [SellerProfile],
) -> Result<()> {
    let (mut at, mut channels, mut addresses, mut digests) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, p) in profiles.iter().enumerate() {
        for (channel, address) in [("email", &p.email), ("sms", &p.phone)] {
            if let Some(address) = address {
                at.push((i, channel));
                channels.push(channel);
                addresses.push(address.as_str());
                digests.push(key.digest(channel, address));
            }
        }
    }
    if at.is_empty() {
        return Ok(());
    }
    let rows = client
        .query(Hot(SUPPRESSED_DESTINATIONS), &[&channels, &addresses, &digests])
        .await?;
    for r in rows {
        let n: i64 = r.get(0);
        let Some(&(i, channel)) = usize::try_from(n - 1).ok().and_then(|n| at.get(n)) else {
            continue;
        };
        let reason = SuppressionReason::parse(r.get(1));
        let suppressed = &mut profiles[i].suppressed;
        match channel {
            "email" => suppressed.email = suppressed.email.or(reason),
            _ => suppressed.sms = suppressed.sms.or(reason),
        }
    }
    Ok(())
}

#[derive(Default)]
struct UpsertColumns<'a> {
    marketplace: Vec<&'a str>,
    seller: Vec<&'a str>,
    email: Vec<Option<&'a str>>,
    phone: Vec<Option<&'a str>>,
    locale: Vec<Option<&'a str>>,
    email_opt_in: Vec<bool>,
    sms_opt_in: Vec<bool>,
    version: Vec<i64>,
}

impl<'a> UpsertColumns<'a> {
    fn push(&mut self, p: &'a SellerProfile) {
        self.marketplace.push(&p.marketplace_id);
        self.seller.push(&p.seller_id);
        self.email.push(p.email.as_deref());
        self.phone.push(p.phone.as_deref());
        self.locale.push(p.locale.as_deref());
        self.email_opt_in.push(p.email_opt_in);
        self.sms_opt_in.push(p.sms_opt_in);
        self.version.push(p.version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(seller: &str, version: i64) -> SellerRecord {
        SellerRecord::Upsert(SellerProfile {
            marketplace_id: "acme".into(),
            seller_id: seller.into(),
            email: None,
            phone: None,
            locale: None,
            email_opt_in: false,
            sms_opt_in: false,
            version,
            suppressed: Default::default(),
        })
    }

    fn del(seller: &str) -> SellerRecord {
        SellerRecord::Delete {
            marketplace_id: "acme".into(),
            seller_id: seller.into(),
        }
    }

    #[test]
    fn folding_keeps_one_record_per_seller() {
        let folded = fold_seller_records(vec![up("a", 2), up("b", 1), up("a", 1), up("a", 3), del("b")]);
        assert_eq!(folded, vec![up("a", 3), del("b")]);
        let folded = fold_seller_records(vec![up("b", 1), up("a", 1)]);
        assert_eq!(folded, vec![up("a", 1), up("b", 1)]);
        let folded = fold_seller_records(vec![del("a"), up("a", 1)]);
        assert_eq!(folded, vec![up("a", 1)]);
    }
}
