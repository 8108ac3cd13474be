//! The admin API's extractors: axum's `Json`, `Query` and `Path`, whose refusals are
//! answered as every other error of the API is (`{"error": ...}`, application/json) instead
//! of axum's plain text. A body that is not JSON is 415; anything else they refuse is 400.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

use super::ApiError;

/// A JSON request body.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Json::<T>::from_request(req, state)
            .await
            .map(|Json(v)| Body(v))
            .map_err(|r| refused(r.status(), r.body_text()))
    }
}

/// Query parameters.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|r| refused(r.status(), r.body_text()))
    }
}

/// One path parameter, percent-decoded.
pub struct PathParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| PathParam(v))
            .map_err(|r| refused(r.status(), r.body_text()))
    }
}

fn refused(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError(status, text),
        // Syntax (400), data (422) and anything else a client sent that would not extract.
        s if s.is_client_error() => ApiError(StatusCode::BAD_REQUEST, text),
        s => ApiError(s, text),
    }
}
